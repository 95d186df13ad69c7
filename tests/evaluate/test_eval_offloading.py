"""Selective offloading: the paper's loss-difference rule by hand, ranking, thresholds, reverted calls."""

from __future__ import annotations

import numpy as np
import pytest

from lmlm.evaluate.offloading import (
    fact_loss_differences,
    keep_lookups,
    offload_documents,
    offload_thresholds,
    offloaded_keys,
    ranked_facts,
)
from lmlm.scoring import token_logprobs
from lmlm.lookup import Lookup, Text, lookups, strip
from lmlm.tokens import CALL, ORG

DELTAS = {("A", "r"): 3.0, ("B", "r"): 0.5, ("C", "r"): 2.0, ("D", "r"): -1.0}


def test_ranking_ratios_and_thresholds_by_hand():
    assert ranked_facts(DELTAS) == [("A", "r"), ("C", "r"), ("B", "r"), ("D", "r")]
    assert offloaded_keys(DELTAS, 0.0) == set()
    assert offloaded_keys(DELTAS, 0.5) == {("A", "r"), ("C", "r")}          # the largest differences first
    assert offloaded_keys(DELTAS, 0.75) == {("A", "r"), ("C", "r"), ("B", "r")}
    assert offloaded_keys(DELTAS, 1.0) == set(DELTAS)
    assert offload_thresholds(DELTAS, [0.0, 0.25, 0.5, 1.0]) == {0.0: None, 0.25: 3.0, 0.5: 2.0, 1.0: -1.0}
    with pytest.raises(ValueError):
        offloaded_keys(DELTAS, 1.5)


def test_reverted_calls_leave_the_text_as_it_was():
    doc = [Text("Ada was born in "), Lookup("Ada", "Birth City", "Paris"), Text(" Paris and works as a "),
           Lookup("Ada", "Job", "baker"), Text(" baker.")]
    kept = keep_lookups(doc, lambda lk: lk.relation == "Job")
    assert lookups(kept) == [Lookup("Ada", "Job", "baker")] and strip(kept) == strip(doc)
    assert kept[0] == Text("Ada was born in Paris and works as a ")
    assert offload_documents([doc], set()) == [[Text(strip(doc))]]
    assert offload_documents([doc], {("Ada", "Birth City"), ("Ada", "Job")}) == [doc]


def test_loss_difference_by_hand(world):
    docs = [[Text(f"{n} was born in "), Lookup(n, "Birth City", c), Text(f" {c}. {n} works as a "),
             Lookup(n, "Occupation", j), Text(f" {j}.")] for n, c, j in world.people[:3]]
    # the same model on both sides: LMLM-side tokens see the call, Standard-side ones do not
    deltas = fact_loss_differences(world.model, world.model, world.tok, docs, n_tokens=5)
    assert set(deltas) == {lk.key for d in docs for lk in lookups(d)}
    # by hand for the first call of the first document
    tok = world.tok
    enc, plain = tok.encode(docs[0]), tok.encode_plain(strip(docs[0]))
    lp_l, lp_s = token_logprobs(world.model, [enc.input_ids])[0], token_logprobs(world.model, [plain.input_ids])[0]
    end = next(t for t, (i, r) in enumerate(zip(enc.input_ids, enc.roles)) if i == tok.end_id and r == CALL)
    after = [t for t in range(end + 1, len(enc)) if enc.roles[t] == ORG][:5]
    org_index = [sum(r == ORG for r in enc.roles[:t]) for t in after]    # the same tokens in the clean document
    assert [enc.input_ids[t] for t in after] == [plain.input_ids[j] for j in org_index]
    expected = -np.mean([lp_s[j - 1] for j in org_index]) + np.mean([lp_l[t - 1] for t in after])
    assert deltas[(world.people[0][0], "Birth City")] == pytest.approx(expected, rel=1e-5)
