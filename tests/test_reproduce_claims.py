"""The claim checks on hand-made numbers: each tests every number it names, monotone where it says so."""

from __future__ import annotations

from lmlm.reproduce.claims import check_claims
from lmlm.reproduce.unlearning import forget_verdict


def _fs(x):
    return {"factscore_score_no_penalty": x, "factscore_score": x / 2}


def _system(fs, trex, popqa):
    return {"metrics": {"factscore": _fs(fs), "trex": {"trex_exact_match": trex},
                        "popqa": {"popqa_accuracy": popqa}}}


def _stages(**extra) -> dict:
    systems = {"standard": _system(0.10, 0.20, 0.20), "lmlm": _system(0.80, 0.90, 0.85),
               "lmlm_no_db": _system(0.01, 0.02, 0.02), "lmlm_calls_stripped": _system(0.05, 0.10, 0.05),
               "lmlm_prefix_tree": _system(0.70, 0.90, 0.85)}
    nlu = {"lmlm": {"nlu_acc_norm": 0.27, "nlu_n": 300.0, "above_chance": {"p_value": 0.2}},
           "standard": {"nlu_acc_norm": 0.26, "nlu_n": 300.0, "above_chance": {"p_value": 0.3}}}
    stages = {"factual": {"systems": systems, "nlu": {"bios_continuation": nlu},
                          "n": {"trex": 400, "popqa": 400, "factscore": 50}}}
    stages.update(extra)
    return stages


def _find(claims, start):
    found = [c for c in claims if c["claim"].startswith(start)]
    assert found, start
    return found


def test_every_claim_states_margin_n_and_seeds():
    for c in check_claims(_stages()):
        assert set(c) == {"claim", "paper", "ours", "holds", "margin", "n", "seeds"}
        if c["holds"] is not None:
            assert c["margin"], c["claim"]


def test_rag_must_improve_every_metric_it_names():
    # the run: FactScore 0.3 -> 0.0 while T-REx and PopQA rose; "2 of 3" used to call this a hold
    stages = _stages(rag={"metrics": {"factscore": _fs(0.0), "trex": {"trex_exact_match": 0.5},
                                      "popqa": {"popqa_accuracy": 0.3}}})
    stages["factual"]["systems"]["standard"]["metrics"]["factscore"] = _fs(0.003)
    (c,) = _find(check_claims(stages), "RAG improves the Standard model")
    assert c["holds"] is False
    stages["rag"]["metrics"]["factscore"] = _fs(0.2)
    assert _find(check_claims(stages), "RAG improves the Standard model")[0]["holds"] is True


def _offload(ppl_dynamic, ppl_static=(3.0, 2.8, 2.6, 2.4, 2.39, 2.2)):
    ratios = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
    return {"ratios": [{"ratio": r, "perplexity_dynamic": d, "perplexity_static": s, "trex_exact_match": 0.2 + r / 2,
                        "nlu_acc_norm": 0.5, "nlu_n": 300.0, "nlu_above_chance": {"p_value": 1e-9},
                        "heldout_documents": 100}
                       for r, d, s in zip(ratios, ppl_dynamic, ppl_static)]}


def test_more_offloading_lowers_perplexity_at_every_step_of_the_dynamic_one():
    # 2.39 at 90% and 2.72 at 100% (the run) is not "more offloading lowers perplexity"
    c = _find(check_claims(_stages(offloading=_offload((3.0, 2.8, 2.6, 2.5, 2.39, 2.72)))), "More offloading lowers")[0]
    assert c["holds"] is False and "dynamic" in c["claim"]
    assert _find(check_claims(_stages(offloading=_offload((3.0, 2.8, 2.6, 2.5, 2.39, 2.3)))),
                 "More offloading lowers")[0]["holds"] is True
    # static falling by construction does not carry a dynamic perplexity that rises
    rising = _offload((2.0, 2.1, 2.2, 2.3, 2.4, 2.5))
    assert _find(check_claims(_stages(offloading=rising)), "More offloading lowers")[0]["holds"] is False


def test_a_step_up_within_the_seed_spread_is_a_tie():
    seeds = {"summary": {"ppl_dynamic": {"mean": 2.4, "sd": 0.05, "min": 2.35, "max": 2.45, "n": 3}}}
    wobble = _offload((3.0, 2.8, 2.6, 2.5, 2.39, 2.45))  # up by 0.06 < 2 sd
    c = _find(check_claims(_stages(offloading=wobble, seeds=seeds)), "More offloading lowers")[0]
    assert c["holds"] is True and "0.100" in c["margin"]


def test_nlu_at_chance_cannot_support_a_claim():
    c = _find(check_claims(_stages()), "LMLM does no worse than Standard on language")[0]
    assert c["holds"] is None and "at chance" in c["ours"]
    stages = _stages()
    for m in ("lmlm", "standard"):
        stages["factual"]["nlu"]["bios_continuation"][m]["above_chance"]["p_value"] = 1e-6
    assert _find(check_claims(stages), "LMLM does no worse")[0]["holds"] is True


def test_perplexity_margin_must_hold_in_every_seed():
    p = {"lmlm": {"static": 2.0, "dynamic": 4.45, "normalized": 2.5}, "standard": 4.54, "documents": 200}
    margins = {"margin_static": {"mean": 2.5, "sd": 0.1, "min": 2.4, "max": 2.6, "n": 3},
               "margin_dynamic": {"mean": 0.09, "sd": 0.2, "min": -0.1, "max": 0.3, "n": 3},
               "margin_normalized": {"mean": 2.0, "sd": 0.1, "min": 1.9, "max": 2.1, "n": 3}}
    one = _find(check_claims(_stages(bios={"perplexity": p})), "LMLM has lower perplexity")[0]
    assert one["holds"] is True and one["seeds"] == 1
    three = _find(check_claims(_stages(bios={"perplexity": p}, seeds={"summary": margins})), "LMLM has lower perplexity")[0]
    assert three["holds"] is False and three["seeds"] == 3 and "0.09 ± 0.20" in three["ours"]


def _tofu(trajectory):
    m = {"forget_quality": 0.001, "model_utility": 0.5, "tofu_retain_prob": 0.6}
    return {"models": {"lmlm_full": m, "lmlm_unlearned": {**m, "forget_quality": 0.4}},
            "deletion": {"seconds": 0.01}, "unlearning_runs": {"npo-0": {"trajectory": trajectory}}}


def test_npo_is_read_where_it_forgets_or_at_its_end_not_at_its_best_point():
    traj = [{"step": 0, "forget_quality": 0.001, "model_utility": 0.50, "tofu_retain_prob": 0.6},
            {"step": 5, "forget_quality": 0.02, "model_utility": 0.40, "tofu_retain_prob": 0.5},  # the best point
            {"step": 10, "forget_quality": 0.01, "model_utility": 0.52, "tofu_retain_prob": 0.5}]
    c = _find(check_claims(_stages(tofu=_tofu(traj))), "NPO on the Standard model")[0]
    assert c["holds"] is False and "end of run" in c["ours"]  # never forgot; at its end utility is up
    traj[2] = {"step": 10, "forget_quality": 0.3, "model_utility": 0.30, "tofu_retain_prob": 0.5}
    c = _find(check_claims(_stages(tofu=_tofu(traj))), "NPO on the Standard model")[0]
    assert c["holds"] is True and "step 10" in c["ours"]
    utility = _find(check_claims(_stages(tofu=_tofu(traj))), "...with no loss of model utility")[0]
    assert "by construction" in utility["claim"]


def test_no_database_claims_name_both_ablations():
    claims = check_claims(_stages())
    banned, stripped = _find(claims, "Without its database")
    assert "by construction" in banned["claim"] and "stripped" in stripped["claim"]
    assert banned["holds"] is True and stripped["holds"] is True
    stages = _stages()
    stages["factual"]["systems"]["lmlm_calls_stripped"] = _system(0.6, 0.8, 0.7)  # keeps most of it
    assert _find(check_claims(stages), "Without its database")[1]["holds"] is False


def _seeds(after, values, null, null_values):
    per = {str(k): {"unlearned": {"forget_quality": a, "forget_quality_values": v}}
           for k, (a, v) in enumerate(zip(after, values))}
    return {"per_seed": per, "n_forget": 70,
            "null": {f"{i}-{i + 1}": {"forget_quality": n, "forget_quality_values": nv}
                     for i, (n, nv) in enumerate(zip(null, null_values))}}


def test_forget_verdict():
    assert forget_verdict(_seeds([0.3, 0.5], [0.4, 0.6], [0.8], [0.9]))["label"] == "forgets"
    assert forget_verdict(_seeds([0.03, 0.02], [0.4, 0.6], [0.01], [0.5]))["label"] == "noise"  # the null is low too
    assert forget_verdict(_seeds([0.03, 0.355], [0.4, 0.6], [0.6], [0.5]))["label"] == "noise"  # seeds disagree
    assert forget_verdict(_seeds([0.03, 0.02], [0.4, 0.6], [0.6], [0.5]))["label"] == "the metric"
    assert forget_verdict(_seeds([0.03, 0.02], [0.01, 0.001], [0.6], [0.5]))["label"] == "memorisation"
