"""A biography world's configuration, records and random draws: pools of values, people and their
documents (:func:`draw_world`), each from its own seeded stream. Used by :class:`lmlm.worlds.bios.BiosWorld`.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import defaultdict
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import NamedTuple

from .. import corpus
from ..lookup import Lookup, Segment, lookups, parse, render, strip
from .bios_templates import MAJORS, MONTHS, NAME_LOCALES, RELATIONS, WORLD_SOURCE, compose

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


class WorldFact(NamedTuple):
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

def rng_for(config: BiosConfig, stream: str) -> random.Random:
    # One independent stream per purpose: changing how documents are drawn leaves the people alone.
    return random.Random(f"bios:{config.seed}:{stream}")


def _faker(config: BiosConfig, stream: str, locale: str = "en_US"):
    from ..errors import need

    fake = need("faker", "worlds", "synthetic worlds").Faker(locale)
    fake.seed_instance(f"bios:{config.seed}:{stream}:{locale}")
    return fake


def _unique(draw, n: int, what: str) -> list[str]:
    seen: dict[str, None] = {}
    for _ in range(50 * n + 100):
        if len(seen) == n:
            return list(seen)
        seen.setdefault(draw(), None)
    raise RuntimeError(f"could not draw {n} distinct {what}; lower the pool size")


def random_date(rng: random.Random, years: tuple[int, int]) -> str:
    d = date.fromordinal(rng.randint(date(years[0], 1, 1).toordinal(), date(years[1], 12, 31).toordinal()))
    return f"{MONTHS[d.month - 1]} {d.day}, {d.year}"


def make_pools(config: BiosConfig) -> dict[str, list[str]]:
    """The shared value pools (birth dates are drawn from the year range instead)."""
    fake, rng = _faker(config, "pools"), rng_for(config, "pools")
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
    rng = rng_for(config, "names")
    fakers = {loc: _faker(config, "names", loc) for loc in ("en_US", *NAME_LOCALES)}

    def locale() -> str:
        return rng.choice(NAME_LOCALES) if rng.random() < config.international_names else "en_US"

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


def make_people(config: BiosConfig, pools: dict[str, list[str]]) -> list[Person]:
    rng = rng_for(config, "people")
    people = []
    for name, gender in _make_names(config):
        facts = {rel: random_date(rng, config.birth_years) if rel == "Birth Date" else rng.choice(pools[rel])
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




def make_documents(config: BiosConfig, people: list[Person]) -> tuple[list[Document], list[Document]]:
    rng = rng_for(config, "documents")
    drafts = [(p, compose(p, config, rng)) for p in people if p.split == "train" for _ in range(p.mentions)]
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
            segs = compose(p, config, rng)
            if strip(segs) not in seen_text[p.name]:
                break
        heldout.append(Document(f"bios-heldout-{len(heldout):06d}", p.name, segs, "heldout"))
    return train, heldout


