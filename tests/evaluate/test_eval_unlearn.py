"""Unlearning: NPO's loss by hand, real gradient-ascent and NPO runs on a tiny model, the LMLM's KB delete,
annotated (KB-answered) likelihoods, and TOFU's summary of a model."""

from __future__ import annotations

import math

import pytest
import torch
from eval_support import DictKB

from lmlm.evaluate.tofu import (
    TofuItem,
    kb_answered,
    ks_2samp,
    tofu_answer_stats,
    truth_ratio,
    truth_ratio_score,
    value_span,
    value_truth_ratios,
)
from lmlm.evaluate.unlearn import (
    UnlearnConfig,
    forget_keys,
    kb_unlearn,
    npo_loss,
    qa_batch,
    sequence_logprobs,
    tofu_summary,
    unlearn,
)
from lmlm.kb import KnowledgeBase, Triple
from lmlm.lookup import Lookup, Text, parse, render
from lmlm.tokens import VALUE


def _items(world, people, annotated: bool = True):
    out = []
    for n, c, _ in people:
        ann = (lambda city: render([Text(f"{n} was born in "), Lookup(n, "Birth City", c), Text(f" {city}.")]))
        out.append(TofuItem(f"Where was {n} born?", f"{n} was born in {c}.", f"{n} was born in {c}.",
                            tuple(f"{n} was born in {x}." for x in ("Oslo", "Lima") if x != c),
                            ann(c) if annotated else None, ann(c) if annotated else None,
                            tuple(ann(x) for x in ("Oslo", "Lima") if x != c) if annotated else ()))
    return out


def test_npo_loss_by_hand():
    # equal to the reference: -(2 / beta) * log sigmoid(0) = (2 / beta) * log 2
    assert float(npo_loss(torch.tensor([-5.0, -1.0]), torch.tensor([-5.0, -1.0]), 0.1)) == pytest.approx(20 * math.log(2))
    # one row 10 nats below the reference with beta = 0.1: -(20) * log sigmoid(1)
    assert float(npo_loss(torch.tensor([-11.0]), torch.tensor([-1.0]), 0.1)) == pytest.approx(
        -20 * math.log(1 / (1 + math.exp(-1.0))))
    with pytest.raises(ValueError, match="method"):
        UnlearnConfig(method="sgd")


def test_qa_batch_labels_only_the_answer(world):
    items = _items(world, world.people[:2])
    ids, labels, mask = qa_batch(world.tok, items)
    for r, it in enumerate(items):
        answer = world.tok.encode_text("Question: " + it.question + "\nAnswer: " + it.answer)
        ctx = world.tok.encode_text("Question: " + it.question + "\nAnswer:")
        kept = labels[r][labels[r] != -100].tolist()
        assert kept == answer[len(ctx):] and ids[r, 0] == world.tok.doc_id
        assert int(mask[r].sum()) == 1 + len(answer)
    logp, n = sequence_logprobs(world.model, ids, labels, mask)
    assert n.tolist() == [int((labels[r] != -100).sum()) for r in range(2)] and (logp < 0).all()


@pytest.mark.parametrize("method", ["ga", "npo"])
def test_unlearning_runs_lower_the_forget_probability(world, method):
    forget, retain = _items(world, world.people[:3]), _items(world, world.people[3:9])
    before = [s["prob"] for s in tofu_answer_stats(world.model, world.tok, forget)]
    seen = []
    res = unlearn(world.model, world.tok, forget, retain,
                  UnlearnConfig(method=method, steps=6, lr=3e-3, batch_size=3, eval_every=3),
                  evaluate=lambda m: seen.append(m.training) or {"p": sum(s["prob"] for s in tofu_answer_stats(m, world.tok, forget))})
    after = [s["prob"] for s in tofu_answer_stats(res.model, world.tok, forget)]
    assert sum(after) < 0.5 * sum(before)                                # the forget answers got much less likely
    assert [r["step"] for r in res.trajectory] == [0, 3, 6] and seen == [False] * 3
    assert res.trajectory[-1]["p"] == pytest.approx(sum(after), rel=1e-4)
    assert len(res.losses) == 6 and res.model is not world.model
    assert [s["prob"] for s in tofu_answer_stats(world.model, world.tok, forget)] == pytest.approx(before)  # untouched


def test_kb_unlearn_deletes_the_forget_facts(world, tmp_path):
    items = _items(world, world.people[:2])
    assert forget_keys(items) == [(n, "Birth City") for n, _, _ in world.people[:2]]
    kb = KnowledgeBase.create(tmp_path / "kb")
    kb.add([Triple(e, r, v) for (e, r), v in world.facts.items()], embed=False)
    res = kb_unlearn(kb, items)
    assert res["deleted"] == 2 and res["keys"] == 2 and res["seconds"] >= 0
    assert kb.lookup(*forget_keys(items)[0], fuzzy=False) is None
    n, c, _ = world.people[2]
    assert kb.lookup(n, "Birth City", fuzzy=False).value == c
    kb.close()
    with pytest.raises(ValueError, match="annotated"):
        forget_keys(_items(world, world.people[:1], annotated=False))


def test_annotated_scoring_skips_values_and_uses_the_kb(world):
    items = _items(world, world.people[:2])
    kb = DictKB(world.facts)
    stats = tofu_answer_stats(world.model, world.tok, items, kb=kb)
    # by hand for the first answer: the trained tokens after the context (no value tokens, no <|db_end|>)
    it = items[0]
    segs = [Text("Question: " + it.question + "\nAnswer:")] + parse(" " + it.annotated_answer).segments
    enc = world.tok.encode(segs)
    first = 1 + len(world.tok.encode_text("Question: " + it.question + "\nAnswer:"))
    keep = [k for k in range(first, len(enc)) if enc.roles[k] != VALUE and enc.input_ids[k] != world.tok.end_id]
    from lmlm.scoring import token_logprobs
    lp = token_logprobs(world.model, [enc.input_ids])[0]
    assert stats[0]["prob"] == pytest.approx(math.exp(sum(lp[k - 1] for k in keep) / len(keep)), rel=1e-5)
    # with the fact deleted the call returns "unknown": a different likelihood of the same answer
    gone = DictKB({k: v for k, v in world.facts.items() if k != (world.people[0][0], "Birth City")})
    assert tofu_answer_stats(world.model, world.tok, items[:1], kb=gone)[0]["prob"] != pytest.approx(stats[0]["prob"])
    with pytest.raises(ValueError, match="annotated"):
        tofu_answer_stats(world.model, world.tok, _items(world, world.people[:1], annotated=False), kb=kb)


def test_tofu_summary(world):
    sets = {"forget": _items(world, world.people[:3]), "retain": _items(world, world.people[3:6]),
            "world_facts": _items(world, world.people[6:9])}
    ref = [0.5, 0.9, 1.3]
    s = tofu_summary(world.model, world.tok, sets, retain_ratios=ref)
    assert len(s["forget_truth_ratios"]) == 3
    assert s["forget_quality"] == pytest.approx(ks_2samp(s["forget_truth_ratios"], ref)[1])
    assert s["tofu_forget_truth_ratio"] == pytest.approx(truth_ratio_score(s["forget_truth_ratios"], forget=True))
    utility = [s[k] for k in ("tofu_retain_prob", "tofu_retain_truth_ratio", "tofu_world_facts_prob",
                              "tofu_world_facts_truth_ratio")]
    expected = 0.0 if min(utility) == 0 else len(utility) / sum(1 / v for v in utility)
    assert s["model_utility"] == pytest.approx(expected)                 # no generator: no ROUGE values
    assert tofu_summary(world.model, world.tok, sets)["forget_quality"] is None


def test_value_span():
    assert value_span("Ada was born in Paris.", ["Ada was born in Oslo.", "Ada was born in Lima."]) == (16, 21)
    # perturbations sharing a first word with the value still give the whole value
    assert value_span("It is Lake Jennifer.", ["It is Lake Amy.", "It is Port Jennifer."]) == (6, 19)
    assert value_span("Same.", ["Same."]) is None


def _value_logprob(world, context: str, prefix: str, value: str, rest: str) -> tuple[float, int]:
    """By hand: the log-probability of ``value``'s tokens, the tokens of the text with the value past
    those of the text before it (byte-level BPE splits before a space)."""
    from lmlm.scoring import token_logprobs

    tok = world.tok
    head = [tok.doc_id, *tok.encode_text(context + prefix)]
    with_value = [tok.doc_id, *tok.encode_text(context + prefix + value)]
    full = [tok.doc_id, *tok.encode_text(context + prefix + value + rest)]
    assert with_value[:len(head)] == head and full[:len(with_value)] == with_value
    lp = token_logprobs(world.model, [full])[0]
    return float(sum(lp[k - 1] for k in range(len(head), len(with_value)))), len(with_value) - len(head)


def test_value_truth_ratios_by_hand(world):
    items = _items(world, world.people[:2])
    ratios = value_truth_ratios(world.model, world.tok, items)
    for it, r, (n, c, _) in zip(items, ratios, world.people[:2]):
        ctx = "Question: " + it.question + "\nAnswer: "
        para = _value_logprob(world, ctx, f"{n} was born in", f" {c}", ".")
        pert = [_value_logprob(world, ctx, f"{n} was born in", f" {x}", ".") for x in ("Oslo", "Lima") if x != c]
        assert r == pytest.approx(truth_ratio(para, pert), rel=1e-5)
    # an LMLM with its KB: the value it writes after the call, the call answered by the KB
    kb = DictKB(world.facts)
    annotated = value_truth_ratios(world.model, world.tok, items, kb=kb)
    it, (n, c, _) = items[0], world.people[0]
    tok = world.tok
    from lmlm.scoring import token_logprobs

    def after_call(value: str) -> tuple[float, int]:
        segs = [Text("Question: " + it.question + "\nAnswer: ")] + kb_answered(
            [parse(render([Text(f"{n} was born in "), Lookup(n, "Birth City", c), Text(f" {value}.")])).segments], kb)[0]
        enc = tok.encode(segs)
        start = enc.input_ids.index(tok.end_id) + 1
        k = len(tok.encode_text(f" {value}"))
        lp = token_logprobs(world.model, [enc.input_ids])[0]
        return float(sum(lp[j - 1] for j in range(start, start + k))), k

    pert = [after_call(x) for x in ("Oslo", "Lima") if x != c]
    assert annotated[0] == pytest.approx(truth_ratio(after_call(c), pert), rel=1e-5)
    s = tofu_summary(world.model, world.tok, {"forget": items}, kb=kb, retain_value_ratios=[0.5, 1.5])
    assert s["forget_value_truth_ratios"] == pytest.approx(annotated)
    assert s["forget_quality_values"] == pytest.approx(ks_2samp(annotated, [0.5, 1.5])[1])
