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
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .. import corpus
from ..jsonio import write_json, write_jsonl
from ..lookup import plain_text
from .bios_draw import (BIOS_PRESETS, BiosConfig, ClozePrompt, Document, Edit, Person, WorldFact, make_documents,
                        make_people, make_pools, random_date, rng_for)
from .bios_templates import CLOZE_TEMPLATES, COMPILED, RELATIONS, SPLITS, TEMPLATES, claim_templates, fill

__all__ = [
    "RELATIONS", "TEMPLATES", "CLOZE_TEMPLATES", "BIOS_PRESETS", "BiosConfig", "Person", "Document",
    "WorldFact", "ClozePrompt", "Edit", "BiosWorld", "claim_templates",
]


# ---------------------------------------------------------------------------------------------
# the world

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
        pools = make_pools(config)
        people = make_people(config, pools)
        train, heldout = make_documents(config, people)
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
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
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
    def _triples(self, split: str, with_sources: bool) -> list[WorldFact]:
        rows, all_sources = [], self._sources if with_sources else {}
        for p in self.people_in(split):
            for rel, value in p.facts.items():
                sources = all_sources.get((p.name, rel), [])
                rows += [WorldFact(p.name, rel, value, s) for s in sources] or [WorldFact(p.name, rel, value, None)]
        return rows

    def triples(self) -> list[WorldFact]:
        """The KB at training time: every fact of every train person, one row per document stating it
        (``source`` = doc id), or one row with ``source=None`` for a fact no document states."""
        return self._triples("train", with_sources=True)

    def added_triples(self) -> list[WorldFact]:
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
        text, positions = plain_text(fill(COMPILED[(relation,)][0], p, named=True))
        return ClozePrompt(text[:positions[0]].rstrip(), p.facts[relation], p.name, relation)

    def phrasings(self, person: str, relation: str) -> list[str]:
        """Every prompt of the relation's own templates that names the person and ends right before the
        value, the :meth:`cloze` prompt first (``"Ada Lind was born in"``, ``"Ada Lind's hometown is"`` ...):
        an edit prompt and its paraphrases."""
        if relation not in CLOZE_TEMPLATES:
            raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
        p = self.person(person)
        out = []
        for parts in COMPILED[(relation,)]:
            text, positions = plain_text(fill(parts, p, named=True))
            prompt = text[:positions[0]].rstrip()
            if p.name in prompt:
                out.append(prompt)
        return list(dict.fromkeys(out))

    def cloze_set(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[ClozePrompt]:
        """Cloze prompts over the (person, relation) pairs of ``split``; ``n`` samples that many."""
        pairs = [(p.name, rel) for p in self.people_in(split) for rel in RELATIONS]
        if n is not None:
            if n < 0:
                raise ValueError(f"n must be >= 0, got {n}")
            picked = set(rng_for(self.config, f"cloze:{split}:{seed}").sample(range(len(pairs)), min(n, len(pairs))))
            pairs = [pair for i, pair in enumerate(pairs) if i in picked]
        return [self.cloze(name, rel) for name, rel in pairs]

    def edits(self, n: int, seed: int = 0) -> list[Edit]:
        """``n`` distinct facts of train people, each given a different value from the same pool."""
        pairs = [(p.name, rel) for p in self.people_in("train") for rel in RELATIONS]
        if not 0 <= n <= len(pairs):
            raise ValueError(f"n must be between 0 and {len(pairs)}, got {n}")
        rng = rng_for(self.config, f"edits:{seed}")
        out = []
        for name, rel in rng.sample(pairs, n):
            old = self.person(name).facts[rel]
            new = old
            while new == old:
                new = random_date(rng, self.config.birth_years) if rel == "Birth Date" else rng.choice(self.pools[rel])
            out.append(Edit(name, rel, old, new))
        return out

    def forget_set(self, fraction: float = 0.05, seed: int = 0) -> list[str]:
        """Names of train people to unlearn (at least one when ``fraction > 0``), in world order."""
        if not 0 <= fraction <= 1:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        train = [p.name for p in self.people_in("train")]
        k = max(1, round(fraction * len(train))) if fraction > 0 else 0
        picked = set(rng_for(self.config, f"forget:{seed}").sample(train, k))
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
            "people": {s: len(self.people_in(s)) for s in SPLITS},
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
        write_jsonl(folder / "people.jsonl", (dataclasses.asdict(p) for p in self.people))
        write_jsonl(folder / "triples.jsonl", [
            {**dict(zip(WorldFact._fields, t)), "split": split}
            for split, rows in (("train", self.triples()), ("added", self.added_triples())) for t in rows])
        write_json(folder / "config.json", self.config.to_dict())
        write_json(folder / "pools.json", self.pools, indent=1, ensure_ascii=False)
        write_json(folder / "stats.json", self.stats())
        write_jsonl(folder / "aliases.jsonl", [{"alias": a, "entity": e, "split": split}
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

