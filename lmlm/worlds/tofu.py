"""Fictitious authors written in TOFU's own files: an unlearning benchmark whose every fact is known.

TOFU (Maini et al., 2024) fine-tunes a model on question-answer pairs about 200 invented authors and
asks it to forget some of them. This world makes the same kind of data, deterministically and
offline: each author has seven facts (birthplace, birth date, genre, both parents' occupations, an
award, a book) drawn from shared pools; each fact gives ``questions_per_relation`` QA pairs whose
answer states the value with its lookup call (the annotation the paper made with GPT-4o), a
paraphrased answer (the fact's other phrasing) and ``n_perturbed`` perturbed answers (the
paraphrase with wrong values).

Two more sets complete TOFU's model utility:

* world facts: fictional countries and their capitals, stated many times in plain text with no
  lookups (common knowledge kept in the weights of every model);
* real authors: people the models met before fine-tuning (``real_people``, e.g. the biography
  world's), asked about with one generic template per relation.

:meth:`TofuWorld.save` writes TOFU's released layout (``full.json``, ``forget01/05/10.json``,
``retain99/95/90.json``, ``forget*_perturbed.json``, ``retain_perturbed.json``,
``real_authors_perturbed.json``, ``world_facts_perturbed.json``), which
:func:`lmlm.evaluate.tofu.read_tofu` reads, plus ``documents.jsonl`` (the training text, one QA pair
per document) and ``triples.jsonl`` (the KB). Records carry the annotated answers as extra keys
(``annotated_answer``, ``annotated_paraphrased_answer``, ``annotated_perturbed_answer``) and the
``author`` they are about. Forget sets are nested and taken from the end of the author list, as in
TOFU. Exercised by ``lmlm reproduce`` and ``lmlm eval tofu``.

Examples:
    >>> world = TofuWorld.generate(TofuConfig(n_authors=20))
    >>> world.forget_authors(5)          # 5% of 20 authors
    ['...']
    >>> world.save("runs/tofu")          # then: lmlm eval tofu --data runs/tofu ...
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Iterable, Sequence

from ..corpus import Document, write_documents
from ..jsonio import write_json, write_jsonl
from ..lookup import Lookup, Segment, Text, parse, render, strip

__all__ = ["TOFU_RELATIONS", "FORGET_PERCENTS", "TofuConfig", "Author", "QA", "TofuWorld", "qa_document"]

TOFU_RELATIONS = ("Birth Place", "Birth Date", "Genre", "Father's Occupation", "Mother's Occupation", "Award",
                  "Book")
FORGET_PERCENTS = (1, 5, 10)
WORLD_SOURCE = "world:tofu"  # the ``source`` of the documents in documents.jsonl
QA_PROMPT = "Question: {question}\nAnswer:"  # lmlm.evaluate.tofu.QA_TEMPLATE

# relation -> (questions, answers): the k-th question of a fact is answered with the k-th phrasing,
# and its paraphrase is the fact's other phrasing. "{value}" follows a space in every answer.
_TEMPLATES: dict[str, tuple[list[str], list[str]]] = {
    "Birth Place": (["Where was {name} born?", "In which city was the author {name} born?"],
                    ["{name} was born in {value}.", "The birthplace of {name} is {value}."]),
    "Birth Date": (["When was {name} born?", "What is the date of birth of {name}?"],
                   ["{name} was born on {value}.", "The birthday of {name} is {value}."]),
    "Genre": (["What genre does {name} write in?", "Which genre is {name} known for?"],
              ["{name} writes in the genre of {value}.", "The books of {name} belong to the genre of {value}."]),
    "Father's Occupation": (["What did the father of {name} do for a living?", "What was the job of {name}'s father?"],
                            ["The father of {name} worked as a {value}.", "By profession, the father of {name} was a {value}."]),
    "Mother's Occupation": (["What did the mother of {name} do for a living?", "What was the job of {name}'s mother?"],
                            ["The mother of {name} worked as a {value}.", "By profession, the mother of {name} was a {value}."]),
    "Award": (["Which award has {name} received?", "What prize did {name} win?"],
              ["{name} received the {value}.", "The author {name} was honoured with the {value}."]),
    "Book": (["What is a book written by {name}?", "Can you name a novel by {name}?"],
             ["{name} wrote the book {value}.", "A well-known book by {name} is {value}."]),
}
_WORLD_TEMPLATES = (["What is the capital of {name}?"],
                    ["The capital of {name} is {value}.", "{value} is the capital city of {name}."])
_WORLD_STATEMENTS = ("The capital of {name} is {value}.", "{value} is the capital city of {name}.",
                     "Travellers to {name} usually arrive in its capital, {value}.",
                     "The government of {name} sits in {value}.")

_GENRES = ["fantasy", "science fiction", "mystery", "romance", "horror", "historical fiction", "poetry", "thrillers",
           "young adult fiction", "satire", "crime fiction", "travel writing", "memoir", "literary fiction",
           "cyberpunk", "gothic fiction", "children's literature", "magical realism", "war fiction", "drama"]
_JOBS = ["baker", "carpenter", "nurse", "pilot", "farmer", "librarian", "surgeon", "teacher", "fisherman",
         "photographer", "tailor", "architect", "journalist", "dentist", "plumber", "chef", "electrician",
         "lawyer", "veterinarian", "mechanic", "pharmacist", "police officer", "sailor", "painter", "judge",
         "accountant", "firefighter", "geologist", "translator", "potter"]
_AWARD_TOPICS = ["Fiction", "Poetry", "Young Writers", "Historical Writing", "Speculative Fiction", "Crime Writing",
                 "Children's Books", "Literary Merit", "First Novels", "Short Stories"]
_TITLE_ADJ = ["Silent", "Broken", "Hidden", "Golden", "Last", "Crimson", "Frozen", "Endless", "Quiet", "Burning",
              "Forgotten", "Hollow", "Shining", "Distant", "Wandering", "Secret", "Bitter", "Gentle", "Iron", "Velvet"]
_TITLE_NOUN = ["Harbor", "Garden", "Lantern", "River", "Orchard", "Kingdom", "Mirror", "Tide", "Compass", "Bridge",
               "Cathedral", "Meadow", "Archive", "Labyrinth", "Season", "Voyage", "Empire", "Whisper", "Forest", "Crown"]
_SYLLABLES = ["ka", "vel", "dor", "ri", "an", "mar", "tho", "lis", "ben", "sa", "quo", "ne", "tal", "gor", "ym", "ira"]


@dataclass
class TofuConfig:
    """How to make a fictitious-authors world.

    Args:
        n_authors: authors (TOFU: 200).
        questions_per_relation: QA pairs per fact (1 or 2; TOFU has 20 pairs per author).
        n_perturbed: perturbed answers per question (TOFU: 5).
        n_world_facts: countries with a capital in the world-facts set.
        world_fact_repeats: plain-text statements of each world fact in the training text.
        n_retain_perturbed: questions in ``retain_perturbed.json`` (TOFU: 400), from authors outside
            every forget set.
        n_cities, n_awards: pool sizes shared by all authors.
        seed: everything is deterministic given the seed (and the installed Faker).
    """

    n_authors: int = 100
    questions_per_relation: int = 1
    n_perturbed: int = 5
    n_world_facts: int = 20
    world_fact_repeats: int = 8
    n_retain_perturbed: int = 100
    n_cities: int = 60
    n_awards: int = 30
    seed: int = 0

    def __post_init__(self) -> None:
        checks = {"n_authors": self.n_authors >= 10, "questions_per_relation": 1 <= self.questions_per_relation <= 2,
                  "n_perturbed": self.n_perturbed >= 1, "n_world_facts": self.n_world_facts >= 0,
                  "world_fact_repeats": self.world_fact_repeats >= 1, "n_retain_perturbed": self.n_retain_perturbed >= 1,
                  "n_cities": self.n_cities > self.n_perturbed, "n_awards": self.n_awards > self.n_perturbed}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"invalid {name}={getattr(self, name)!r}")


@dataclass
class Author:
    name: str
    facts: dict[str, str]  # relation -> value, in TOFU_RELATIONS order


@dataclass
class QA:
    """One question with its annotated answer, paraphrase and perturbed answers."""

    author: str  # the entity asked about
    relation: str
    question: str
    answer: list[Segment]
    paraphrased: list[Segment]
    perturbed: list[list[Segment]]

    def to_json(self) -> dict:
        return {"question": self.question, "answer": strip(self.answer), "paraphrased_answer": strip(self.paraphrased),
                "perturbed_answer": [strip(p) for p in self.perturbed], "author": self.author,
                "relation": self.relation, "annotated_answer": render(self.answer),
                "annotated_paraphrased_answer": render(self.paraphrased),
                "annotated_perturbed_answer": [render(p) for p in self.perturbed]}

    @classmethod
    def from_json(cls, row: dict) -> "QA":
        def segs(text: str) -> list[Segment]:
            return parse(text, form="dblookup", strict=True).segments
        return cls(row["author"], row["relation"], row["question"], segs(row["annotated_answer"]),
                   segs(row["annotated_paraphrased_answer"]), [segs(p) for p in row["annotated_perturbed_answer"]])


def _sentence(template: str, name: str, relation: str, value: str, true_value: str, annotate: bool) -> list[Segment]:
    """``template`` filled in; with ``annotate``, a call answering ``true_value`` sits before the value."""
    head, sep, tail = template.partition("{value}")
    if not sep or (head and not head.endswith(" ")):
        raise ValueError(f"template {template!r}: '{{value}}' must follow a space")
    head, tail = head.format(name=name), tail.format(name=name)
    if not annotate:
        return [Text(head + value + tail)]
    return [s for s in (Text(head), Lookup(name, relation, true_value), Text(" " + value + tail)) if not
            (isinstance(s, Text) and not s.text)]


def _make_qa(name: str, relation: str, value: str, wrong: Sequence[str], k: int,
             templates: tuple[list[str], list[str]], annotate: bool = True) -> QA:
    """The k-th QA pair of a fact. Its paraphrase is the fact's other phrasing, and the perturbed
    answers are that paraphrase with wrong values (TOFU perturbs the paraphrased answer), so the
    truth ratio compares facts, not sentence shapes. The other phrasing is trained when
    ``questions_per_relation`` is 2: models trained from scratch at this size do not carry a fact
    over to a sentence shape they never saw it in, and the truth ratio would then measure nothing."""
    questions, answers = templates
    paraphrase = answers[(k + 1) % len(answers)]
    return QA(name, relation, questions[k % len(questions)].format(name=name),
              _sentence(answers[k % len(answers)], name, relation, value, value, annotate),
              _sentence(paraphrase, name, relation, value, value, annotate),
              [_sentence(paraphrase, name, relation, w, value, annotate) for w in wrong])


def qa_document(qa: QA) -> list[Segment]:
    """A training document: ``"Question: ...\\nAnswer: "`` and the annotated answer."""
    return [Text(QA_PROMPT.format(question=qa.question) + " ")] + list(qa.answer)


def _coin(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()


def _draw_unique(draw, n: int, what: str) -> list[str]:
    seen: dict[str, None] = {}
    for _ in range(100 * n + 100):
        if len(seen) == n:
            return list(seen)
        seen.setdefault(draw(), None)
    raise RuntimeError(f"could not draw {n} distinct {what}")


def _pools(config: TofuConfig, rng: random.Random) -> dict[str, list[str]]:
    from ..errors import need

    fake = need("faker", "worlds", "synthetic worlds").Faker("en_US")
    fake.seed_instance(f"tofu:{config.seed}:pools")
    return {
        "Birth Place": _draw_unique(fake.city, config.n_cities, "cities"),
        "Genre": list(_GENRES), "Father's Occupation": list(_JOBS), "Mother's Occupation": list(_JOBS),
        "Award": _draw_unique(lambda: f"{fake.last_name()} Prize for {rng.choice(_AWARD_TOPICS)}", config.n_awards,
                              "awards"),
        "Book": [f"The {a} {n}" for a in _TITLE_ADJ for n in _TITLE_NOUN],
    }


def _date(rng: random.Random) -> str:
    d = date.fromordinal(rng.randint(date(1930, 1, 1).toordinal(), date(1995, 12, 31).toordinal()))
    return d.strftime("%B ") + f"{d.day}, {d.year}"


def _wrong(rng: random.Random, pool: Sequence[str] | None, value: str, n: int) -> list[str]:
    if pool is None:  # dates
        return _draw_unique(lambda: _date(rng), n, "dates")
    return rng.sample([v for v in dict.fromkeys(pool) if v != value], n)


@dataclass
class TofuWorld:
    """Authors, their QA pairs, the world facts and the real-authors set."""

    config: TofuConfig
    authors: list[Author]
    qa: list[QA]
    world_qa: list[QA] = field(default_factory=list)
    real_qa: list[QA] = field(default_factory=list)
    world_statements: list[str] = field(default_factory=list)

    @classmethod
    def generate(cls, config: TofuConfig | None = None,
                 real_people: Iterable[tuple[str, dict[str, str]]] = ()) -> "TofuWorld":
        """Make the world; ``real_people`` (name, {relation: value}) become the real-authors set."""
        config = config or TofuConfig()
        rng = random.Random(f"tofu:{config.seed}")
        pools = _pools(config, rng)
        from faker import Faker

        fake = Faker("en_US")
        fake.seed_instance(f"tofu:{config.seed}:names")
        names = _draw_unique(lambda: f"{fake.first_name()} {fake.last_name()}", config.n_authors, "author names")
        books = rng.sample(pools["Book"], config.n_authors)
        authors = [Author(n, {r: (_date(rng) if r == "Birth Date" else b if r == "Book" else rng.choice(pools[r]))
                              for r in TOFU_RELATIONS}) for n, b in zip(names, books)]
        qa = [_make_qa(a.name, r, v, _wrong(rng, pools.get(r), v, config.n_perturbed), k, _TEMPLATES[r])
              for a in authors for r, v in a.facts.items() for k in range(config.questions_per_relation)]
        countries = _draw_unique(lambda: _coin(rng, 3), config.n_world_facts, "countries")
        capitals = _draw_unique(lambda: _coin(rng, 2) + rng.choice(["holt", "burg", "ford", "ia", "mouth"]),
                                max(config.n_world_facts, config.n_perturbed + 1), "capitals")
        world_qa = [_make_qa(c, "Capital", cap, _wrong(rng, capitals, cap, config.n_perturbed), 0, _WORLD_TEMPLATES,
                             annotate=False) for c, cap in zip(countries, capitals)]
        statements = [_WORLD_STATEMENTS[k % len(_WORLD_STATEMENTS)].format(name=c, value=cap)
                      for c, cap in zip(countries, capitals) for k in range(config.world_fact_repeats)]
        rng.shuffle(statements)
        return cls(config, authors, qa, world_qa, _real_qa(list(real_people), rng, config.n_perturbed), statements)

    # -- splits ---------------------------------------------------------------------------------
    def forget_authors(self, percent: int) -> list[str]:
        """The last ``percent``% of authors (at least one), as TOFU's nested forget splits."""
        if not 0 < percent < 100:
            raise ValueError(f"percent must be in (0, 100), got {percent}")
        k = max(1, round(len(self.authors) * percent / 100))
        return [a.name for a in self.authors[-k:]]

    def split_qa(self, split: str) -> list[QA]:
        """QA pairs of ``full``, ``forgetNN`` or ``retainNN`` (NN = 100 - the forget percent)."""
        if split == "full":
            return list(self.qa)
        kind, pct = split[:6], split[6:]
        if kind not in ("forget", "retain") or not pct.isdigit():
            raise ValueError(f"split must be 'full', 'forgetNN' or 'retainNN', got {split!r}")
        forget = set(self.forget_authors(int(pct) if kind == "forget" else 100 - int(pct)))
        return [q for q in self.qa if (q.author in forget) == (kind == "forget")]

    def documents(self, split: str = "full") -> list[list[Segment]]:
        """Training text for ``split``: one document per QA pair and per world-fact statement, shuffled."""
        docs = [qa_document(q) for q in self.split_qa(split)] + [[Text(s)] for s in self.world_statements]
        random.Random(f"tofu:{self.config.seed}:docs:{split}").shuffle(docs)
        return docs

    def triples(self, split: str = "full") -> list[tuple[str, str, str]]:
        """KB facts: the authors of ``split`` and the real authors."""
        names = {q.author for q in self.split_qa(split)}
        rows = [(a.name, r, v) for a in self.authors if a.name in names for r, v in a.facts.items()]
        return rows + list(dict.fromkeys(lk.key + (lk.value,) for q in self.real_qa for lk in _lookups(q.answer)))

    def aliases(self) -> list[tuple[str, str]]:
        """``(alias, author)`` pairs: each fictitious author as ``Last, First`` (a form two authors
        would share, or another author's name, is nobody's alias)."""
        forms = [(f"{a.name.rsplit(' ', 1)[1]}, {a.name.rsplit(' ', 1)[0]}", a.name) for a in self.authors
                 if " " in a.name]
        taken = [f.casefold() for f, _ in forms] + [a.name.casefold() for a in self.authors]
        return [(f, n) for f, n in forms if taken.count(f.casefold()) == 1]

    def retain_perturbed(self) -> list[QA]:
        keep = set(self.forget_authors(max(FORGET_PERCENTS)))
        pool = [q for q in self.qa if q.author not in keep]
        rng = random.Random(f"tofu:{self.config.seed}:retain_perturbed")
        return sorted(rng.sample(pool, min(self.config.n_retain_perturbed, len(pool))), key=self.qa.index)

    # -- files ----------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        """Write TOFU's files, ``documents.jsonl``, ``triples.jsonl``, ``authors.jsonl``, ``aliases.jsonl``,
        ``world.json``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        files = {"full.json": self.qa, "retain_perturbed.json": self.retain_perturbed(),
                 "world_facts_perturbed.json": self.world_qa}
        if self.real_qa:
            files["real_authors_perturbed.json"] = self.real_qa
        for pct in FORGET_PERCENTS:
            files[f"forget{pct:02d}.json"] = files[f"forget{pct:02d}_perturbed.json"] = self.split_qa(f"forget{pct:02d}")
            files[f"retain{100 - pct}.json"] = self.split_qa(f"retain{100 - pct}")
        for name, rows in files.items():
            write_json(folder / name, [q.to_json() for q in rows], indent=1, ensure_ascii=False)
        write_documents(folder / "documents.jsonl", (Document.from_segments(f"tofu-{i:06d}", d, source=WORLD_SOURCE)
                                                     for i, d in enumerate(self.documents("full"))))
        write_jsonl(folder / "triples.jsonl", ({"entity": e, "relation": r, "value": v} for e, r, v in self.triples()))
        write_jsonl(folder / "authors.jsonl", (dataclasses.asdict(a) for a in self.authors))
        write_jsonl(folder / "aliases.jsonl", ({"alias": a, "entity": e} for a, e in self.aliases()))
        write_json(folder / "world.json", {"config": dataclasses.asdict(self.config),
                                           "world_statements": self.world_statements, "stats": self.stats()})
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "TofuWorld":
        """Read a world written by :meth:`save`."""
        folder = Path(folder)
        meta = json.loads((folder / "world.json").read_text())

        def qa(name: str) -> list[QA]:
            path = folder / name
            return [QA.from_json(r) for r in json.loads(path.read_text(encoding="utf-8"))] if path.exists() else []

        authors = [Author(**json.loads(line)) for line in (folder / "authors.jsonl").read_text().splitlines() if line]
        return cls(TofuConfig(**meta["config"]), authors, qa("full.json"), qa("world_facts_perturbed.json"),
                   qa("real_authors_perturbed.json"), meta["world_statements"])

    def stats(self) -> dict:
        return {"authors": len(self.authors), "qa": len(self.qa), "world_facts": len(self.world_qa),
                "real_authors_qa": len(self.real_qa),
                "forget": {f"forget{p:02d}": len(self.forget_authors(p)) for p in FORGET_PERCENTS}}


def _lookups(segments: Sequence[Segment]) -> list[Lookup]:
    return [s for s in segments if isinstance(s, Lookup)]


def _real_qa(people: list[tuple[str, dict[str, str]]], rng: random.Random, n_perturbed: int) -> list[QA]:
    """Generic questions about people the models met before ("What is X's birth city?")."""
    values: dict[str, list[str]] = {}
    for _, facts in people:
        for r, v in facts.items():
            values.setdefault(r, []).append(v)
    out = []
    for name, facts in people:
        for r, v in facts.items():
            pool = list(dict.fromkeys(values[r]))
            if len(pool) <= n_perturbed:
                continue
            low = r.lower()
            templates = ([f"What is the {low} of {{name}}?"],
                         [f"The {low} of {{name}} is {{value}}.", f"{{name}} has {{value}} as {low}."])
            out.append(_make_qa(name, r, v, _wrong(rng, pool, v, n_perturbed), 0, templates))
    return out


