"""A tiny LMLM and its knowledge base, trained in seconds on a CPU, to try ``lmlm serve`` with.

Forty people, each with a birth city and an occupation, written as short annotated biographies;
a 2-layer GPT-2 (64 wide) learns to write the lookup calls, the KB holds the facts. The model is
far too small to be good at anything else, which makes deletions and edits easy to see: the value
after the call is whatever the KB answers. Exercised by ``lmlm serve --demo DIR``, the serve tests
and ``lmlm bench serve``.

Examples:
    >>> demo = build_demo("runs/serve-demo")
    >>> demo.prompts[0]
    'Ada Lind was born in'
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Demo", "build_demo", "demo_people"]

FIRST = ["Ada", "Bram", "Cleo", "Dario", "Elin", "Farid", "Greta", "Hugo", "Ines", "Jonas",
         "Kira", "Lars", "Mila", "Nico", "Olga", "Pavel", "Quinn", "Rosa", "Soren", "Tara"]
LAST = ["Lind", "Moss"]
CITIES = ["Paris", "Lisbon", "Oslo", "Cairo", "Lima", "Dublin", "Prague", "Vienna", "Quito", "Hanoi"]
JOBS = ["baker", "pilot", "nurse", "farmer", "painter", "lawyer", "sailor", "teacher"]


@dataclass(frozen=True)
class Demo:
    """Where a demo was built, and prompts that make its model look facts up."""

    model_dir: Path
    kb_dir: Path
    people: list[tuple[str, str, str]]  # (name, birth city, occupation)

    @property
    def prompts(self) -> list[str]:
        return [f"{name} was born in" for name, _, _ in self.people] + \
               [f"{name} works as a" for name, _, _ in self.people]

    @property
    def facts(self) -> list[tuple[str, str, str]]:
        """(entity, relation, value) of every fact in the KB as built."""
        return [(n, "Birth City", c) for n, c, _ in self.people] + [(n, "Occupation", j) for n, _, j in self.people]


def demo_people(seed: int = 0) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    return [(f"{f} {last}", rng.choice(CITIES), rng.choice(JOBS)) for f in FIRST for last in LAST]


def _documents(people, rng: random.Random) -> list[list]:
    """Three biographies per person, the two facts in random order, each call right before its value."""
    from ..lookup import Lookup, Text

    docs = []
    for name, city, job in people:
        for _ in range(3):
            born = [Text(f"{name} was born in "), Lookup(name, "Birth City", city), Text(f" {city}.")]
            works = [Text(f"{name} works as a "), Lookup(name, "Occupation", job), Text(f" {job}.")]
            first, second = (born, works) if rng.random() < 0.5 else (works, born)
            docs.append(first + [Text(" ")] + second)
    return docs


def build_demo(out: str | Path, seed: int = 0, steps: int = 250, encoder=None) -> Demo:
    """Train the demo model into ``out/checkpoint`` and build its KB in ``out/kb`` (reused when present).

    Args:
        out: the folder to write to.
        seed: people, documents and initialisation.
        steps: optimizer steps of batch 16 (250 take a few seconds on one CPU core).
        encoder: a :class:`lmlm.kb.Encoder` to build the KB with (default: the KB's own).
    """
    import torch

    from ..checkpoint import is_checkpoint
    from ..kb import KnowledgeBase, Triple
    from ..lookup import strip
    from ..stages import finish_stage, stage_done
    from ..tokens import LookupTokenizer, train_bpe
    from ..train import TrainConfig, train

    out = Path(out)
    people = demo_people(seed)
    demo = Demo(out / "checkpoint", out / "kb", people)
    if is_checkpoint(demo.model_dir) and stage_done(demo.kb_dir) is not None:
        return demo
    docs = _documents(people, random.Random(seed))
    if demo.kb_dir.exists():
        import shutil
        shutil.rmtree(demo.kb_dir)
    kb = KnowledgeBase.create(demo.kb_dir, encoder=encoder)
    kb.add([Triple(e, r, v, source=f"bio-{e.replace(' ', '-').lower()}") for e, r, v in demo.facts],
           who="demo", why="facts of the demo people")
    kb.close()
    finish_stage(demo.kb_dir, {"triples": len(demo.facts)})
    tok = LookupTokenizer(train_bpe([strip(d) for d in docs], vocab_size=600, min_frequency=1))
    config = TrainConfig.from_name("demo", out_dir=str(out), kb=str(demo.kb_dir), max_steps=steps, seed=seed)
    threads = torch.get_num_threads()
    train(config, docs, tok)  # writes out/checkpoint, on one thread
    torch.set_num_threads(threads)  # the caller (a server) keeps its own
    return demo
