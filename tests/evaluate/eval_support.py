"""Helpers for the evaluation tests: a tiny trained LMLM world, a dict KB, a scripted generator."""

from __future__ import annotations

import functools
import random
from types import SimpleNamespace

from tiny_lm import bio_doc, fit_tiny_gpt2

from lmlm.kb import Match
from lmlm.lookup import Lookup, parse, strip
from lmlm.tokens import LookupTokenizer, train_bpe

FIRST = ["Ada", "Bram", "Cleo", "Dario", "Elin", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Lars"]
LAST = ["Lind", "Moss"]
CITIES = ["Paris", "Lisbon", "Oslo", "Cairo", "Lima", "Dublin"]
JOBS = ["baker", "pilot", "nurse", "farmer", "painter", "lawyer"]


class DictKB:
    """A knowledge base of exact keys: ``lookup_batch`` as :class:`lmlm.kb.KnowledgeBase` answers it."""

    def __init__(self, facts: dict[tuple[str, str], str]):
        self.facts = dict(facts)

    def lookup_batch(self, queries, **_):
        out = []
        for e, r in queries:
            v = self.facts.get((e, r))
            out.append(None if v is None else Match(e, r, v, 1.0, 1, True, (), 1, 0))
        return out

    def triples(self):
        return [SimpleNamespace(entity=e, relation=r, value=v, active=True) for (e, r), v in self.facts.items()]


class ScriptedGenerator:
    """Stands in for ``LookupGenerator``: returns a fixed annotated continuation per prompt."""

    def __init__(self, outputs: dict[str, str]):
        self.outputs, self.calls = outputs, []

    def generate(self, prompts, **kwargs):
        self.calls.append(kwargs)
        res = []
        for p in prompts:
            segs = parse(self.outputs.get(p, "")).segments
            res.append(SimpleNamespace(prompt=p, text=self.outputs.get(p, ""), clean_text=strip(segs), segments=segs,
                                       trace=[SimpleNamespace(found=True, value=s.value, query_entity=s.entity,
                                                              query_relation=s.relation, matched_entity=s.entity)
                                              for s in segs
                                              if isinstance(s, Lookup)]))
        return res


@functools.cache
def tiny_world():
    """A GPT-2 (2 layers, 48 wide) trained on 24 people's annotated biographies, its tokenizer and facts."""
    rng = random.Random(0)
    people = [(f"{f} {last}", rng.choice(CITIES), rng.choice(JOBS)) for f in FIRST for last in LAST]
    docs = [bio_doc(*p, rng) for p in people for _ in range(3)]
    tok = LookupTokenizer(train_bpe([strip(d) for d in docs], vocab_size=400, min_frequency=1))
    model, loss = fit_tiny_gpt2(tok, docs, n_embd=48, n_positions=128, steps=250, lr=4e-3)
    facts = {(n, "Birth City"): c for n, c, _ in people} | {(n, "Occupation"): j for n, _, j in people}
    return SimpleNamespace(tok=tok, model=model.eval(), people=people, facts=facts, loss=loss)
