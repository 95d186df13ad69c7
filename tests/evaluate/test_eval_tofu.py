"""TOFU metrics against hand-computed values, the KS test against known p-values, TOFU's file format."""

from __future__ import annotations

import json
import math

import pytest
from eval_support import DictKB

from lmlm.evaluate.tofu import (
    TofuItem,
    forget_quality,
    ks_2samp,
    model_utility,
    normalized_probability,
    option_probability,
    read_tofu,
    rouge_l_recall,
    tofu_eval,
    truth_ratio,
    truth_ratio_score,
)
from lmlm.generate import LookupGenerator


def test_rouge_l_recall_by_hand():
    # reference tokens: the cat is on the mat (6); LCS with "the cat sat on a mat": the cat on mat (4)
    assert rouge_l_recall("the cat sat on a mat", "The cat is on the mat.") == pytest.approx(4 / 6)
    assert rouge_l_recall("anything", "") == 0.0 and rouge_l_recall("", "a b") == 0.0


def test_rouge_l_recall_stems_only_when_asked():
    # reference "cats were running" (3 tokens); stemmed, "cat run" matches two of them
    assert rouge_l_recall("the cat ran and run", "cats were running") == 0.0
    assert rouge_l_recall("the cat ran and run", "cats were running", use_stemmer=True) == pytest.approx(2 / 3)


def test_probabilities_and_truth_ratio_by_hand():
    assert normalized_probability(2 * math.log(0.25), 2) == pytest.approx(0.25)
    assert option_probability(0.5, [0.25, 0.25]) == pytest.approx(0.5)
    # paraphrased: 0.5 per token; perturbed: 0.25 and 0.0625 per token -> geometric mean 0.125 -> R = 0.25
    r = truth_ratio((2 * math.log(0.5), 2), [(math.log(0.25), 1), (2 * math.log(0.0625), 2)])
    assert r == pytest.approx(0.25)
    assert truth_ratio_score([0.25, 4.0]) == pytest.approx((0.75 + 0.0) / 2)            # max(0, 1 - R)
    assert truth_ratio_score([0.25, 4.0], forget=True) == pytest.approx((0.25 + 0.25) / 2)  # min(R, 1/R)
    with pytest.raises(ValueError):
        truth_ratio((0.0, 1), [])


def test_ks_2samp_exact_and_asymptotic():
    assert ks_2samp([1, 2], [3, 4]) == (1.0, pytest.approx(1 / 3))       # 2 of C(4, 2) paths reach D = 1
    assert ks_2samp([1, 2, 3], [4, 5, 6])[1] == pytest.approx(2 / 20)    # 2 of C(6, 3)
    assert ks_2samp([1, 3], [2, 4]) == (0.5, pytest.approx(1.0))
    a, b = list(range(50)), list(range(15, 65))                         # D = 15 / 50
    d, p = ks_2samp(a, b, method="asymp")  # near the Kolmogorov limit at sqrt(25) * 0.3 = 1.5 (0.022)
    assert d == pytest.approx(0.3) and 0.01 < p < 0.03
    assert forget_quality(a, a) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="method"):
        ks_2samp(a, b, method="nope")


def test_ks_2samp_matches_scipy():
    from scipy import stats  # a dependency
    import random

    rng = random.Random(0)
    for n, m in [(5, 7), (40, 40), (40, 37)]:
        a, b = [rng.gauss(0, 1) for _ in range(n)], [rng.gauss(0.4, 1) for _ in range(m)]
        ref = stats.ks_2samp(a, b)
        d, p = ks_2samp(a, b)
        assert d == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue, rel=1e-9)


def test_model_utility_harmonic_mean():
    assert model_utility([0.5, 0.25]) == pytest.approx(2 / (2 + 4))
    assert model_utility({"retain_prob": 0.9, "retain_rouge": 0.0}) == 0.0
    with pytest.raises(ValueError):
        model_utility([])


def test_read_tofu(tmp_path):
    (tmp_path / "forget01.json").write_text(
        json.dumps({"question": "Where was Basil born?", "answer": "Basil was born in Kuwait City."}) + "\n"
        + json.dumps({"question": "What does Basil write?", "answer": "Fantasy."}) + "\n")
    (tmp_path / "forget01_perturbed.json").write_text(json.dumps(
        {"question": "Where was Basil born?", "answer": "Basil was born in Kuwait City.",
         "paraphrased_answer": "Kuwait City is Basil's birthplace.",
         "perturbed_answer": ["Basil was born in Cairo.", "Basil was born in Oslo."]}) + "\n")
    plain = read_tofu(tmp_path / "forget01.json")
    assert plain == [TofuItem("Where was Basil born?", "Basil was born in Kuwait City."),
                     TofuItem("What does Basil write?", "Fantasy.")]
    pert = read_tofu(tmp_path / "forget01_perturbed.json")[0]
    assert pert.paraphrased_answer.startswith("Kuwait") and len(pert.perturbed_answers) == 2
    (tmp_path / "list.json").write_text(json.dumps([{"question": "q", "answer": "a"}]))  # a JSON list works too
    assert read_tofu(tmp_path / "list.json") == [TofuItem("q", "a")]


def test_read_tofu_names_a_malformed_record(tmp_path):
    """A field of the wrong type stops the reader with the file, the record and the field (was a TypeError
    deep in scoring, or in the reader itself for a number where a list of answers belongs)."""
    good = {"question": "Where was Basil born?", "answer": "Kuwait City.", "paraphrased_answer": "In Kuwait City.",
            "perturbed_answer": ["In Cairo.", "In Oslo."]}
    for field, value in (("perturbed_answer", 5), ("perturbed_answer", ["In Cairo.", None]),
                         ("paraphrased_answer", ["In Kuwait City."]), ("answer", 3)):
        (tmp_path / "f.json").write_text(json.dumps(good) + "\n" + json.dumps({**good, field: value}) + "\n")
        with pytest.raises(ValueError, match=rf"f\.json: record 2: '{field}' is "):
            read_tofu(tmp_path / "f.json")
    (tmp_path / "f.json").write_text(json.dumps(good) + "\n" + json.dumps(["a", "b"]) + "\n")
    with pytest.raises(ValueError, match=r"record 2 needs 'question' and 'answer'; got list"):
        read_tofu(tmp_path / "f.json")


def test_tofu_eval_on_a_tiny_model(world):
    items = [TofuItem(f"Where was {n} born?", f"{n} was born in {c}.", f"{n} is from {c}.",
                      (f"{n} was born in Oslo.", f"{n} was born in Lima."))
             for n, c, _ in world.people[:3]]
    gen = LookupGenerator(world.model, world.tok, DictKB(world.facts))
    records = []
    m = tofu_eval(world.model, world.tok, items, split="forget05", generator=gen, max_new_tokens=12, records=records)
    assert set(m) == {"tofu_forget05_prob", "tofu_forget05_rouge_l_recall", "tofu_forget05_truth_ratio",
                      "tofu_forget05_n"}
    assert 0 < m["tofu_forget05_prob"] <= 1 and 0 <= m["tofu_forget05_rouge_l_recall"] <= 1
    assert m["tofu_forget05_truth_ratio"] == pytest.approx(truth_ratio_score([r["truth_ratio"] for r in records],
                                                                             forget=True))
    real = tofu_eval(world.model, world.tok, items, split="real_authors")  # probabilities over the options
    assert real["tofu_real_authors_prob"] == pytest.approx(sum(r["option_prob"] for r in records) / 3)
