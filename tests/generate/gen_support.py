"""The generation tests' world: a tokenizer and a tiny GPT-2 trained here on an annotated biography
corpus of 40 people, their facts, and a KB of them (fixtures in ``conftest``)."""

from __future__ import annotations

import functools
import random
from types import SimpleNamespace

from tiny_lm import bio_doc, fit_tiny_gpt2

from lmlm.kb import KnowledgeBase, Triple
from lmlm.lookup import strip
from lmlm.tokens import LookupTokenizer, train_bpe

FIRST = ["Ada", "Bram", "Cleo", "Dario", "Elin", "Farid", "Greta", "Hugo", "Ines", "Jonas",
         "Kira", "Lars", "Mila", "Nico", "Olga", "Pavel", "Quinn", "Rosa", "Soren", "Tara"]
LAST = ["Lind", "Moss"]
CITIES = ["Paris", "Lisbon", "Oslo", "Cairo", "Lima", "Dublin", "Prague", "Vienna", "Quito", "Hanoi"]
JOBS = ["baker", "pilot", "nurse", "farmer", "painter", "lawyer", "sailor", "teacher"]


def make_kb(world, path: str = "kb") -> KnowledgeBase:
    """A KB holding the world's facts, each citing the biography it came from."""
    kb = KnowledgeBase.create(path)
    kb.add([Triple(e, r, v, source=f"bio-{e}") for (e, r), v in world.facts.items()])
    return kb


@functools.cache
def trained_world():
    """A tokenizer, a GPT-2 trained on 40 people's annotated biographies, and their facts (built once
    per session; every generation test file shares it)."""
    rng = random.Random(0)
    people = [(f"{f} {last}", rng.choice(CITIES), rng.choice(JOBS)) for f in FIRST for last in LAST]
    docs = [bio_doc(*p, rng) for p in people for _ in range(3)]
    tok = LookupTokenizer(train_bpe([strip(d) for d in docs], vocab_size=600, min_frequency=1))
    model, loss = fit_tiny_gpt2(tok, docs, n_embd=64, n_positions=256, steps=250, lr=3e-3)
    assert loss < 0.6
    facts = {(n, "Birth City"): c for n, c, _ in people} | {(n, "Occupation"): j for n, _, j in people}
    return SimpleNamespace(tok=tok, model=model.eval(), people=people, facts=facts)



def bio_prompts(world, n: int = 30) -> list[str]:
    """Openings of the first ``n`` people's biographies, some with a fact stated before the call."""
    tails = ["was born in", "works as a"]
    return [f"{name} {tails[i % 2]}" if i % 3 else f"{name} works as a {job}. {name} was born in"
            for i, (name, _, job) in enumerate(world.people[:n])]
