"""Perplexity by group, and dynamic lookups counted as found only when the KB answered for the right person."""

from __future__ import annotations

import math

import pytest
from eval_support import DictKB

from lmlm.evaluate.perplexity import dynamic_perplexity, same_entity, standard_perplexity, static_perplexity
from lmlm.generate import LookupGenerator
from lmlm.kb import Match
from lmlm.lookup import Lookup, Text, strip


class NamesakeKB:
    """Holds only namesakes of the people written about (same last name, first name Zed) and answers
    every query with the namesake's fact, as a fuzzy match over whole keys can."""

    def lookup_batch(self, queries, **_):
        return [Match(f"Zed {e.split()[-1]}" if e else "Zed", r, "Lima", 0.85, 1, False, (), 1, 0) for e, r in queries]


def _docs(world, people):
    return [[Text(f"{n} was born in "), Lookup(n, "Birth City", c), Text(f" {c}. {n} works as a "),
             Lookup(n, "Occupation", j), Text(f" {j}.")] for n, c, j in people]


def test_same_entity():
    assert same_entity("Ada  lind", "ada Lind") and not same_entity("Ada Lind", "Ada Moss")
    assert not same_entity(None, "Ada Lind")


def test_perplexity_by_group_pools_to_the_whole(world):
    docs = _docs(world, world.people[:8])
    groups = ["trained"] * 5 + ["added"] * 3
    st = static_perplexity(world.model, world.tok, docs, groups=groups)
    sp = standard_perplexity(world.model, world.tok, [strip(d) for d in docs], groups=groups)
    for res, key, total in ((st, "static", st["static"]), (sp, "perplexity", sp["perplexity"])):
        g = res["by_group"]
        assert [g["trained"]["documents"], g["added"]["documents"]] == [5, 3]
        assert g["trained"]["org_tokens"] + g["added"]["org_tokens"] == res["org_tokens"]
        pooled = sum(math.log(x[key]) * x["org_tokens"] for x in g.values()) / res["org_tokens"]
        assert math.exp(pooled) == pytest.approx(total)
    # one group alone is the whole computed on its documents only
    alone = static_perplexity(world.model, world.tok, docs[5:])
    assert st["by_group"]["added"]["static"] == pytest.approx(alone["static"])


def test_a_namesakes_answer_is_not_a_found_lookup(world):
    people = world.people[:6]
    docs = _docs(world, people)
    wrong = dynamic_perplexity(LookupGenerator(world.model, world.tok, NamesakeKB()), docs)
    assert wrong["lookups"] == 12 and wrong["lookup_matched_rate"] == 1.0
    assert wrong["lookup_found_rate"] == 0.0 and wrong["lookup_wrong_entity"] == 12
    right = dynamic_perplexity(LookupGenerator(world.model, world.tok, DictKB(world.facts)), docs,
                               groups=["a"] * 3 + ["b"] * 3)
    # an exact KB answers the queries that name someone it holds; this small model often names another
    # of its 24 people, which is an answer about the wrong person too
    assert 0 < right["lookup_found_rate"] <= right["lookup_matched_rate"]
    assert right["lookup_wrong_entity"] == round(right["lookups"] * (right["lookup_matched_rate"] - right["lookup_found_rate"]))
    assert sum(g["lookups"] for g in right["by_group"].values()) == right["lookups"]


def test_a_document_longer_than_the_context_is_scored_whole(world):
    """A document of many biographies, past the model's 128 positions: static and dynamic perplexity
    score every text token (in windows), where they used to score the first window or stop."""
    from lmlm.models import max_positions

    segments = [seg for d in _docs(world, world.people[:12]) for seg in (*d, Text(" "))]
    n_tokens = len(world.tok.encode(segments).input_ids)
    assert n_tokens > 2 * max_positions(world.model)
    st = static_perplexity(world.model, world.tok, [segments])
    short = static_perplexity(world.model, world.tok, _docs(world, world.people[:12]))
    assert st["org_tokens"] >= short["org_tokens"] and math.isfinite(st["static"])
    dyn = dynamic_perplexity(LookupGenerator(world.model, world.tok, DictKB(world.facts)), [segments])
    assert dyn["org_tokens"] == st["org_tokens"] and dyn["lookups"] == 24
    sp = standard_perplexity(world.model, world.tok, [strip(segments)])
    assert sp["org_tokens"] >= 0.9 * st["org_tokens"]


def test_an_empty_document_is_scored_as_no_tokens(world):
    """A corpus with an empty document (a blank record of a user's file) scores as the others alone."""
    docs = _docs(world, world.people[:3])
    st, alone = static_perplexity(world.model, world.tok, docs + [[]]), static_perplexity(world.model, world.tok, docs)
    assert st["org_tokens"] == alone["org_tokens"] and st["static"] == pytest.approx(alone["static"])
    assert st["role_loss"] == pytest.approx(alone["role_loss"])
    dyn = dynamic_perplexity(LookupGenerator(world.model, world.tok, DictKB(world.facts)), docs + [[]])
    assert dyn["org_tokens"] == st["org_tokens"] and dyn["lookups"] == 6
    assert standard_perplexity(world.model, world.tok, [strip(d) for d in docs] + [""])["org_tokens"] > 0


def test_long_scoring_shows_progress_on_stderr(world, capsys):
    """Perplexity over a user's corpus can take minutes: each part shows a bar on stderr, nothing on stdout."""
    docs = _docs(world, world.people[:4])
    quiet = static_perplexity(world.model, world.tok, docs)
    assert capsys.readouterr().err == ""
    st = static_perplexity(world.model, world.tok, docs, progress=True)
    dyn = dynamic_perplexity(LookupGenerator(world.model, world.tok, DictKB(world.facts)), docs, progress=True)
    standard_perplexity(world.model, world.tok, [strip(d) for d in docs], progress=True)
    out = capsys.readouterr()
    assert st["static"] == quiet["static"] and dyn["lookups"] == 8 and out.out == ""
    assert all(label in out.err for label in ("static", "dynamic: calls", "8/8", "dynamic: score", "perplexity"))
