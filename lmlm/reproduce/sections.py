"""The Markdown sections of the reproduction report, one per protocol, each beside the paper's numbers."""

from __future__ import annotations

import json

from .claims import FACTSCORE_KEY, fmt, metric, pct
from .paper import PAPER

__all__ = ["claims_section", "perplexity_section", "factual_section", "rag_section", "tofu_section",
           "offloading_section", "closing", "metrics_of"]

SYSTEMS = (("standard", "Standard"), ("lmlm_no_db", "LMLM, lookup tokens banned"),
           ("lmlm_calls_stripped", "LMLM, calls unanswered and stripped"), ("lmlm_prefix_tree", "LMLM prefix-tree"),
           ("lmlm", "LMLM"))


def metrics_of(stages: dict, system: str, reader: str | None = None) -> list:
    return [metric(stages, system, k, reader) for k in ("factscore", "trex", "popqa")]


def _row(name: str, ours: list, paper) -> str:
    return f"| {name} | " + " | ".join(pct(v) for v in ours) + " | " + " / ".join(str(x) for x in paper) + " |"


def claims_section(claims: list[dict]) -> list[str]:
    mark = {True: "holds", False: "does not hold", None: "–"}
    lines = ["## Claims of the paper at this scale", "",
             "Each check tests every number it names, with the margin it requires; where seeds were run the "
             "margin must hold in every seed (mean ± sd, worst seed shown). '–': no number, or one that cannot "
             "test the claim (e.g. a model at chance).", "",
             "| claim | paper | ours | margin | n | seeds | |", "|---|---|---|---|---|---:|---|"]
    lines += [f"| {c['claim']} | {c['paper']} | {c['ours']} | {c.get('margin', '')} | {c.get('n', '')} | "
              f"{c.get('seeds', 1)} | {mark[c['holds']]} |" for c in claims]
    return lines + [""]


def perplexity_section(stages: dict) -> list[str]:
    p = stages["bios"]["perplexity"]
    lines = ["## Perplexity (paper figure 'Validation perplexity')", "",
             "Held-out documents; the dynamic setting looks up in a KB that holds the facts of every one of them "
             "(trained people's and people added after training), as the paper's database covers its validation "
             "text. A query counts as found only when the KB answered with a fact of the right person.", "",
             "| documents about | documents | Standard | LMLM static | LMLM dynamic | LMLM normalized | right person found |",
             "|---|---:|---:|---:|---:|---:|---:|",
             f"| all | {p['documents']} | {fmt(p['standard'])} | {fmt(p['lmlm']['static'])} | {fmt(p['lmlm']['dynamic'])} "
             f"| {fmt(p['lmlm']['normalized'])} | {fmt(p['lmlm'].get('dynamic_lookup_found_rate'), 3)} |"]
    for g, r in p.get("by_group", {}).items():
        lines.append(f"| {g} people | {r['documents']} | {fmt(r['standard'])} | {fmt(r['static'])} | {fmt(r['dynamic'])} "
                     f"| {fmt(r['normalized'])} | {fmt(r.get('lookup_found_rate'), 3)} |")
    s = stages.get("seeds")
    if s and len(s.get("rows", [])) > 1:
        lines += ["", f"Over {len(s['rows'])} seeds of the LMLM / Standard pair (seeds {s['seeds']}; mean ± sd, min - max):", "",
                  "| | mean ± sd | min - max |", "|---|---:|---:|"]
        names = {"ppl_standard": "Standard", "ppl_static": "LMLM static", "ppl_dynamic": "LMLM dynamic",
                 "ppl_normalized": "LMLM normalized", "trex_lmlm": "T-REx EM, LMLM", "trex_lmlm_no_db":
                 "T-REx EM, LMLM without DB", "trex_standard": "T-REx EM, Standard",
                 "trex_standard_stated": "T-REx EM, Standard, stated facts"}
        for k, label in names.items():
            m = s["summary"].get(k) or {}
            if m.get("mean") is not None:
                lines.append(f"| {label} | {m['mean']:.3f} ± {m['sd']:.3f} | {m['min']:.3f} - {m['max']:.3f} |")
    lines += ["", f"Paper: LMLM lower than Standard in all three variants at every size; dynamic lower by "
              f"{PAPER['perplexity']['dynamic_reduction']} on average. LMLM loss per token role (held-out, static): "
              + ", ".join(f"{k} {v:.2f}" for k, v in p["lmlm"]["role_loss"].items()) + ".", "",
              "![perplexity](figures/perplexity.png)", ""]
    return lines


def _stated_table(stages: dict, systems) -> list[str]:
    f = stages["factual"]
    lines = ["| model | T-REx stated | T-REx KB only | PopQA stated | PopQA KB only | FactScore claims stated | "
             "FactScore claims KB only |", "|---|---:|---:|---:|---:|---:|---:|"]
    for key, name in systems:
        b = f["systems"].get(key, {}).get("by_stated")
        if b:
            lines.append(f"| {name} | " + " | ".join(pct(b[p].get(g)) for p in ("trex", "popqa", "factscore")
                                                     for g in ("stated", "kb_only")) + " |")
    t = f["systems"]["lmlm"]["by_stated"]
    return lines + ["", "Items: T-REx {} stated / {} KB only, PopQA {} / {}; FactScore claims of the LMLM {} / {}.".format(
        *(int(t[p][f"n_{g}"] or 0) for p in ("trex", "popqa", "factscore") for g in ("stated", "kb_only"))), ""]


def factual_section(stages: dict) -> list[str]:
    f = stages["factual"]
    fp = PAPER["factual_precision"]["LLaMA2-176M"]
    nd = PAPER["no_database"]["LLaMA2-176M"]
    pt = PAPER["prefix_tree"]["LLaMA2-176M"]
    lines = ["## Factual precision (paper table 'Evaluations on factual precision')", "",
             f"The biography world's facts in each benchmark's format: {f['n']['factscore']} FactScore topics "
             "(claims = the facts each sentence states, read by the relation its phrasing names; a value the world "
             "does not have counts as unsupported), "
             f"{f['n']['trex']} T-REx facts (exact match in the first 5 content words; LMLM: lookup forced at the "
             f"mask), {f['n']['popqa']} PopQA questions (completion format). Percent. FactScore is shown without "
             "its length penalty: with gamma = 10 and at most six facts per person a perfect biography scores at "
             "most 51.3 with it (the paper's biographies are long enough not to pay it).", "",
             "| model | FactScore | T-REx EM | PopQA Acc | paper, LLaMA2-176M (FS / T-REx / PopQA) |",
             "|---|---:|---:|---:|---|",
             _row("Standard", metrics_of(stages, "standard"), fp["standard"]),
             _row("LMLM", metrics_of(stages, "lmlm"), fp["lmlm"]), "",
             "Facts stated in some training document vs facts only the KB holds (no Standard model could learn "
             "these; the benchmarks sample both):", ""]
    lines += _stated_table(stages, [s for s in SYSTEMS if s[0] in f["systems"]])
    lines += ["![factual precision](figures/factual_precision.png)", "",
              "## Database ablation (paper table 'Impact of database access')", "",
              "Banning the lookup tokens scores near zero by construction: the LMLM's values were never in its "
              "loss. The paper's comparison lets the model write its calls and strips them: here each call gets no "
              "value and the model continues on its own.", "",
              "| model | FactScore | T-REx EM | PopQA Acc | paper, LLaMA2-176M (FS / T-REx) |", "|---|---:|---:|---:|---|",
              _row("Standard", metrics_of(stages, "standard"), nd["standard"]),
              _row("LMLM, lookup tokens banned", metrics_of(stages, "lmlm_no_db"), nd["lmlm_no_db"])]
    if "lmlm_calls_stripped" in f["systems"]:
        lines.append(_row("LMLM, calls unanswered and stripped", metrics_of(stages, "lmlm_calls_stripped"), nd["lmlm_no_db"]))
    lines += [_row("LMLM", metrics_of(stages, "lmlm"), nd["lmlm"]), "",
              "## Prefix-tree vs fuzzy matching (paper table 'Fuzzy Match and Prefix-Tree Decoding')", "",
              "| model | FactScore w/o length penalty | with it | facts / response | invented values | paper, LLaMA2-176M "
              "(with / w/o / facts) |", "|---|---:|---:|---:|---:|---|"]
    for name, key, paper in (("Standard", "standard", pt["standard"]), ("LMLM prefix-tree", "lmlm_prefix_tree", pt["prefix_tree"]),
                             ("LMLM fuzzy", "lmlm", pt["fuzzy"])):
        m = f["systems"][key]["metrics"]["factscore"]
        lines.append(f"| {name} | {pct(m[FACTSCORE_KEY])} | {pct(m['factscore_score'])} | "
                     f"{fmt(m['factscore_claims_per_response'], 1)} | {pct(m.get('factscore_invented'))} | "
                     f"{' / '.join(map(str, paper))} |")
    lines += ["", "![prefix tree](figures/prefix_tree.png)", ""]
    lines += ["## Language understanding (paper table 'NLU')", "",
              "| task | Standard acc_norm | LMLM acc_norm | above chance (binomial p, Standard / LMLM) | paper, LLaMA2-176M |",
              "|---|---:|---:|---|---|"]
    for task, res in f["nlu"].items():
        paper = PAPER["nlu"]["LLaMA2-176M"]
        ch = [(res[m].get("above_chance") or {}).get("p_value") for m in ("standard", "lmlm")]
        lines.append(f"| {task} | {pct(res['standard']['nlu_acc_norm'])} | {pct(res['lmlm']['nlu_acc_norm'])} | "
                     f"{fmt(ch[0], 3)} / {fmt(ch[1], 3)} | {paper['standard']} vs {paper['lmlm']} |")
    lines += ["", "`bios_continuation`: a held-out sentence without facts, cut in half; its true ending against "
              "those of three other sentences (chance: 25%; the benchmarks of the paper's NLU table need data these "
              "worlds do not have; pass `nlu_data` to score a BIG-bench file too).", ""]
    return lines


def _reader_passages(stages: dict) -> str:
    """What the trained reader saw: passages before how many of its training documents (asked and given)."""
    asked = pct(stages["config"].get("rag_reader_fraction"))
    given = stages["rag"].get("reader_training")
    if not given:
        return f"passages before {asked}% of its training documents"
    return (f"passages before {given['with_passages']} of its {given['documents']} training documents ({asked}% "
            "asked; a document whose passages do not fit in the training length gets none)")


def rag_section(stages: dict) -> list[str]:
    r, q = stages["rag"], PAPER["rag"]
    lines = ["## RAG baseline (paper table 'RAG vs LMLM', GPT2-355M)", "",
             f"BM25 (bm25s) over {r['passages']} passages of the training corpus, top {stages['config']['rag_k']} "
             "prepended in the paper's prompt. Retrieval works: a retrieved passage holds the T-REx answer for "
             f"{pct(r['retrieval_recall_trex'])}% of the facts and names both the subject and the answer for "
             f"{pct(r.get('retrieval_subject_answer_trex'))}%. Two readers: the Standard model with passages at "
             "inference only (the paper's baseline: a 355M model pretrained on Wikipedia reads its context; a 5M "
             "model trained on short biographies never learned to), and a reader trained like it but with "
             f"{_reader_passages(stages)}. The paper's comparison is the first reader; the second is what RAG "
             "gives when the reader can read.", "",
             "| model | FactScore | T-REx EM | PopQA Acc | T-REx EM, answer-bearing passage given | paper (FS / T-REx / PopQA) |",
             "|---|---:|---:|---:|---:|---|",
             "| Standard | " + " | ".join(pct(v) for v in metrics_of(stages, "standard"))
             + f" | – | {' / '.join(map(str, q['gpt2_medium']))} |"]
    names = {"standard": "Standard + RAG (inference only, as the paper)", "reader": "RAG reader (trained with passages)"}
    for name, res in r.get("readers", {}).items():
        vals = metrics_of(stages, "rag", name)
        lines.append(f"| {names.get(name, name)} | " + " | ".join(pct(v) for v in vals)
                     + f" | {pct(res.get('oracle_passage_trex'))} | {' / '.join(map(str, q['gpt2_medium_rag']))} |")
    lines += ["| LMLM | " + " | ".join(pct(v) for v in metrics_of(stages, "lmlm")) + f" | – | {' / '.join(map(str, q['lmlm']))} |",
              "", f"The answer-bearing passage control uses the {r.get('oracle_items')} T-REx items for which a "
              "training passage names both subject and answer.", "", "![rag](figures/rag.png)", ""]
    return lines


def _tofu_seeds(t: dict) -> list[str]:
    s, v = t.get("seeds"), t.get("verdict")
    if not s:
        return []
    lines = ["", f"LMLM fine-tuned under {len(s['per_seed'])} seeds; forget quality against the retain model of the "
             f"same seed, over all answer tokens and over value tokens only (n = {s['n_forget']} forget questions):", "",
             "| seed | before delete | after delete | after delete, value tokens | retain model utility |",
             "|---:|---:|---:|---:|---:|"]
    for seed, r in s["per_seed"].items():
        lines.append(f"| {seed} | {fmt(r['full'].get('forget_quality'), 4)} | {fmt(r['unlearned'].get('forget_quality'), 4)} "
                     f"| {fmt(r['unlearned'].get('forget_quality_values'), 4)} | {fmt(r['retain'].get('model_utility'), 3)} |")
    if s["null"]:
        lines += ["", "The null: forget quality of one LMLM retain model against another that differs only by its "
                  "seed (what 'no difference' scores at this n): " + ", ".join(
                      f"seeds {k}: {fmt(x['forget_quality'], 4)} (value tokens {fmt(x['forget_quality_values'], 4)})"
                      for k, x in s["null"].items()) + "."]
    if v:
        lines += ["", f"**Verdict on a low forget quality after the KB delete: {v['label']}** ({v['text']})."]
    return lines


def tofu_section(t: dict) -> list[str]:
    lines = ["## Unlearning on TOFU (paper figure 'Evaluation of Machine Unlearning')", "",
             f"World: {json.dumps(t['world'])}. Forget split `{t['forget_split']}`; LMLM unlearning deleted "
             f"{t['deletion']['deleted']} facts ({t['deletion']['keys']} keys) in {t['deletion']['seconds'] * 1000:.0f} ms. "
             "Forget quality: KS p-value of the forget-set truth ratios against the retain model of the same kind "
             "(paper: above 0.05 means indistinguishable). Model utility is unchanged by construction for a KB "
             "delete (no weight changes, no utility fact is deleted).", "",
             "| model | forget quality | value tokens only | model utility | forget ROUGE-L | retain ROUGE-L | forget prob | retain prob |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    names = {"standard_retain": "Standard retain model", "standard_full": "Standard fine-tuned",
             "lmlm_retain": "LMLM retain model", "lmlm_full": "LMLM fine-tuned", "lmlm_unlearned": "LMLM after KB delete"}
    rows = [(names[k], m) for k, m in t["models"].items()]
    for name, run in t["unlearning_runs"].items():
        rows.append((f"Standard + {name.rsplit('-', 1)[0].upper()} (step {run['trajectory'][-1]['step']})", run["trajectory"][-1]))
    for name, m in rows:
        lines.append(f"| {name} | {fmt(m.get('forget_quality'), 4)} | {fmt(m.get('forget_quality_values'), 4)} | "
                     f"{fmt(m.get('model_utility'), 3)} | {fmt(m.get('tofu_forget_rouge_l_recall'), 3)} | "
                     f"{fmt(m.get('tofu_retain_rouge_l_recall'), 3)} | {fmt(m.get('tofu_forget_prob'), 3)} | "
                     f"{fmt(m.get('tofu_retain_prob'), 3)} |")
    lines += _tofu_seeds(t)
    lines += ["", "![tofu](figures/tofu.png)", ""]
    return lines


def offloading_section(o: dict) -> list[str]:
    paper = PAPER["offloading"]["thresholds"]
    lines = ["## Selective offloading (paper figure 'Effect of different offloading ratios')", "",
             f"{o['facts']} facts ranked by the loss difference of the 5 tokens after their call (Standard - LMLM). "
             "Dynamic perplexity is the one the claim reads: static perplexity is given the oracle's values, so "
             "it falls almost by construction as more facts are offloaded.", "",
             "| offloaded | facts | perplexity (dynamic) | perplexity (static) | perplexity (normalized) | T-REx EM | "
             "continuation acc_norm |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(o["ratios"], key=lambda r: r["ratio"]):
        lines.append(f"| {r['ratio']:.0%} | {r['facts_offloaded']} | {fmt(r.get('perplexity_dynamic'))} | "
                     f"{fmt(r['perplexity_static'])} | {fmt(r['perplexity_normalized'])} | {pct(r['trex_exact_match'])} "
                     f"| {pct(r['nlu_acc_norm'])} |")
    lines += ["", "Loss-difference threshold per ratio (nats), ours vs the paper's: " + ", ".join(
        f"{float(k):.0%} {fmt(v)} vs {paper.get(float(k), '–')}" for k, v in o["thresholds"].items()) + ".", "",
        "![offloading](figures/offloading.png)", ""]
    return lines


def closing(claims: list[dict]) -> list[str]:
    held = [c for c in claims if c["holds"] is True]
    failed = [c for c in claims if c["holds"] is False]
    untested = [c for c in claims if c["holds"] is None and c["ours"]]
    lines = ["## Closing note", "", f"{len(held)} of {len(held) + len(failed)} checked claims hold at this scale"
             + (f"; {len(untested)} could not be tested." if untested else "."), ""]
    for title, group in (("What holds:", held), ("What does not:", failed), ("What these numbers cannot test:", untested)):
        if group:
            lines += [title, ""] + [f"- {c['claim']}: {c['ours']} (paper: {c['paper']}; margin: {c.get('margin') or '–'}; "
                                    f"n: {c.get('n') or '–'}; seeds: {c.get('seeds', 1)})." for c in group] + [""]
    lines += ["These are small models (millions of parameters) trained for minutes on synthetic worlds whose facts "
              "are all entity-level and known, so the comparison is of direction, not size; see each table for "
              "the protocol's details.", ""]
    return lines
