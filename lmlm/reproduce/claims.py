"""The paper's qualitative claims, each checked against a reproduction's numbers.

Every check returns the claim, the paper's evidence, ours, whether it holds here (None when the
run has no number for it, or when the numbers cannot test it, e.g. both models at chance), the
margin it requires, the n its numbers rest on and how many seeds. A check tests every number it
names: all the metrics it lists, every step where it says "more ... lowers". Where seeds were run
(stage ``seeds``, the TOFU seeds) a margin must hold in every seed, and the mean and spread are shown.
The report's closing note is made of these.
"""

from __future__ import annotations

import math

from .paper import PAPER

MARGIN = 0.005  # half a point: a "better" smaller than this is a tie
ABOUT = 0.05  # "about the same level": within five points
P_CHANCE = 0.05  # above chance: one-sided binomial p-value below this

__all__ = ["check_claims", "fmt", "metric", "pct", "FACTSCORE_KEY"]

FACTSCORE_KEY = "factscore_score_no_penalty"  # comparable with the paper; the penalty caps six facts at 0.513


def pct(x) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def fmt(x, d: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def _ok(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def metric(stages: dict, system: str, protocol: str, reader: str | None = None) -> float | None:
    """A system's primary number of a protocol; ``system="rag"`` reads the RAG stage (``reader``:
    ``standard`` for the paper's inference-only baseline, ``reader`` for the trained one)."""
    key = {"trex": "trex_exact_match", "popqa": "popqa_accuracy", "factscore": FACTSCORE_KEY}[protocol]
    if system == "rag":
        r = stages.get("rag", {})
        m = r.get("readers", {}).get(reader, {}).get("metrics") if reader else r.get("metrics", {})
    else:
        m = stages.get("factual", {}).get("systems", {}).get(system, {}).get("metrics", {})
    v = (m or {}).get(protocol, {}).get(key)
    return v if _ok(v) else None


def _stated(stages: dict, system: str, protocol: str) -> float | None:
    v = stages.get("factual", {}).get("systems", {}).get(system, {}).get("by_stated", {}).get(protocol, {}).get("stated")
    return v if _ok(v) else None


def _claim(text: str, paper: str, ours: str, holds, margin: str = "", n: str = "", seeds: int = 1) -> dict:
    return {"claim": text, "paper": paper, "ours": ours, "holds": None if holds is None else bool(holds),
            "margin": margin, "n": n, "seeds": seeds}


def _n(stages: dict, *protocols: str) -> str:
    n = stages.get("factual", {}).get("n", {})
    names = {"trex": "T-REx items", "popqa": "PopQA items", "factscore": "FactScore topics"}
    return ", ".join(f"{n.get(p)} {names[p]}" for p in protocols if n.get(p) is not None)


def _seed_summary(stages: dict) -> dict:
    return stages.get("seeds", {}).get("summary", {})


def _mean_sd(s: dict, d: int = 2, scale: float = 1.0) -> str:
    if not s or s.get("mean") is None:
        return "–"
    return f"{scale * s['mean']:.{d}f} ± {scale * s['sd']:.{d}f} (worst {scale * s['min']:.{d}f})"


def _perplexity(stages: dict) -> dict:
    p = stages.get("bios", {}).get("perplexity")
    if not p:
        return _claim("LMLM has lower perplexity than Standard (static, dynamic, normalized)", "", "", None)
    lm, std = p["lmlm"], p["standard"]
    ours = ", ".join(f"{k} {lm[k]:.2f}" for k in ("static", "dynamic", "normalized")) + f" vs Standard {std:.2f}"
    s = _seed_summary(stages)
    margins = [s.get(f"margin_{k}") for k in ("static", "dynamic", "normalized")]
    if all(m and m.get("n", 0) > 1 for m in margins):
        ours += "; margin over seeds (Standard - LMLM, mean ± sd): " + ", ".join(
            f"{k} {_mean_sd(m)}" for k, m in zip(("static", "dynamic", "normalized"), margins))
        holds, seeds = all(m["min"] > 0 for m in margins), margins[0]["n"]
    else:
        holds, seeds = all(lm[k] < std for k in ("static", "dynamic", "normalized")), 1
    return _claim("LMLM has lower perplexity than Standard in all three variants",
                  f"all sizes; dynamic lower by {PAPER['perplexity']['dynamic_reduction']} on average", ours, holds,
                  "Standard - LMLM > 0 in every variant and every seed", f"{p['documents']} held-out documents", seeds)


def _factual(stages: dict) -> list[dict]:
    p = PAPER["factual_precision"]["LLaMA2-176M"]
    out = []
    protos = ("factscore", "trex", "popqa")
    s = [metric(stages, "standard", k) for k in protos]
    m = [metric(stages, "lmlm", k) for k in protos]
    have = all(x is not None for x in s + m)
    ours = ", ".join(f"{pct(a)} -> {pct(b)}" for a, b in zip(s, m)) + " (FactScore without length penalty)"
    holds, seeds = (all(b > a + MARGIN for a, b in zip(s, m)) if have else None), 1
    sm = _seed_summary(stages).get("margin_trex_lmlm_vs_standard")
    if have and sm and sm.get("n", 0) > 1:  # T-REx in every seed
        ours += f"; T-REx LMLM - Standard over seeds {_mean_sd(sm, 1, 100)}"
        holds, seeds = holds and sm["min"] > MARGIN, sm["n"]
    out.append(_claim("LMLM beats Standard on FactScore, T-REx EM and PopQA",
                      "LLaMA2-176M: " + ", ".join(f"{a} -> {b}" for a, b in zip(p["standard"], p["lmlm"])),
                      ours, holds, f"LMLM - Standard > {MARGIN} on each (T-REx: in every seed)",
                      _n(stages, *protos), seeds))
    ss = [_stated(stages, "standard", k) for k in protos]
    ms = [_stated(stages, "lmlm", k) for k in protos]
    have_s = all(x is not None for x in ss + ms)
    out.append(_claim("...also on the facts stated in the training text (the only ones a Standard model can learn)",
                      "not split in the paper", ", ".join(f"{pct(a)} -> {pct(b)}" for a, b in zip(ss, ms)),
                      all(b > a + MARGIN for a, b in zip(ss, ms)) if have_s else None,
                      f"LMLM - Standard > {MARGIN} on each", "stated facts of " + _n(stages, *protos)))
    q = PAPER["no_database"]["LLaMA2-176M"]
    for system, label in (("lmlm_no_db", "lookup tokens banned: near zero by construction, its values were never "
                                         "in its loss"),
                          ("lmlm_calls_stripped", "its calls get no value and are stripped; it continues on its own "
                                                  "(the paper's comparison)")):
        nd = [metric(stages, system, k) for k in ("factscore", "trex")]
        ok = all(x is not None for x in nd + m[:2])
        out.append(_claim(f"Without its database the LMLM loses most of its factual precision ({label})",
                          f"LLaMA2-176M FactScore {q['lmlm'][0]} -> {q['lmlm_no_db'][0]}, "
                          f"T-REx {q['lmlm'][1]} -> {q['lmlm_no_db'][1]}",
                          f"FactScore {pct(m[0])} -> {pct(nd[0])}, T-REx {pct(m[1])} -> {pct(nd[1])}",
                          all(b < a / 2 for a, b in zip(m[:2], nd)) if ok else None,
                          "less than half of the LMLM's on each", _n(stages, "factscore", "trex")))
    nd, st = metric(stages, "lmlm_no_db", "trex"), metric(stages, "lmlm_calls_stripped", "trex")
    sm = _seed_summary(stages).get("margin_trex_no_db_vs_standard")
    ours = f"T-REx banned {pct(nd)}, calls stripped {pct(st)} vs Standard {pct(s[1])}"
    seeds, holds = 1, None
    if all(x is not None for x in (nd, st, s[1])):
        holds = nd <= s[1] + ABOUT and st <= s[1] + ABOUT
        if sm and sm.get("n", 0) > 1:  # the banned variant in every seed
            ours += f"; banned - Standard over seeds {_mean_sd(sm, 1, 100)}"
            holds, seeds = holds and sm["max"] <= ABOUT, sm["n"]
    out.append(_claim("...and falls to about the Standard model's level or below",
                      f"T-REx {q['lmlm_no_db'][1]} vs Standard {q['standard'][1]}", ours, holds,
                      f"at most {ABOUT:.0%} above Standard", _n(stages, "trex"), seeds))
    return out


def _prefix_tree(stages: dict) -> dict:
    q = PAPER["prefix_tree"]["LLaMA2-176M"]
    f, t = metric(stages, "lmlm", "factscore"), metric(stages, "lmlm_prefix_tree", "factscore")
    return _claim("Fuzzy matching beats prefix-tree constrained queries on FactScore",
                  f"LLaMA2-176M {q['fuzzy'][1]} vs {q['prefix_tree'][1]} (without length penalty)",
                  f"{pct(f)} vs {pct(t)}", f > t + MARGIN if f is not None and t is not None else None,
                  f"fuzzy - prefix-tree > {MARGIN}", _n(stages, "factscore"))


def _rag(stages: dict) -> list[dict]:
    q = PAPER["rag"]
    m = [metric(stages, "lmlm", k) for k in ("factscore", "trex", "popqa")]
    s = [metric(stages, "standard", k) for k in ("factscore", "trex", "popqa")]
    readers = stages.get("rag", {}).get("readers") or {"standard": None}
    names = {"standard": "reader: Standard, passages at inference only, as the paper",
             "reader": "reader: Standard trained with passages"}
    out = []
    n = _n(stages, "factscore", "trex", "popqa")
    for reader in readers:
        r = [metric(stages, "rag", k, reader if stages.get("rag", {}).get("readers") else None)
             for k in ("factscore", "trex", "popqa")]
        ok = all(x is not None for x in r + m + s)
        tag = f" ({names.get(reader, reader)})"
        out += [
            _claim("RAG improves the Standard model on FactScore, T-REx EM and PopQA" + tag,
                   f"GPT2-355M: {q['gpt2_medium']} -> {q['gpt2_medium_rag']}",
                   ", ".join(f"{pct(a)} -> {pct(b)}" for a, b in zip(s, r)),
                   all(b > a + MARGIN for a, b in zip(s, r)) if ok else None, f"RAG - Standard > {MARGIN} on each", n),
            _claim("LMLM beats RAG on FactScore and PopQA" + tag, f"{q['lmlm'][0]} vs {q['gpt2_medium_rag'][0]}, "
                   f"{q['lmlm'][2]} vs {q['gpt2_medium_rag'][2]}", f"{pct(m[0])} vs {pct(r[0])}, {pct(m[2])} vs {pct(r[2])}",
                   m[0] > r[0] + MARGIN and m[2] > r[2] + MARGIN if ok else None, f"LMLM - RAG > {MARGIN} on each",
                   _n(stages, "factscore", "popqa")),
            _claim("RAG beats LMLM on T-REx" + tag, f"{q['gpt2_medium_rag'][1]} vs {q['lmlm'][1]}",
                   f"{pct(r[1])} vs {pct(m[1])}", r[1] > m[1] + MARGIN if ok else None, f"RAG - LMLM > {MARGIN}",
                   _n(stages, "trex")),
        ]
    return out


def _chance(res: dict) -> float | None:
    return (res.get("above_chance") or {}).get("p_value")


def _nlu(stages: dict) -> dict:
    n = stages.get("factual", {}).get("nlu", {}).get("bios_continuation")
    q = PAPER["nlu"]["LLaMA2-176M"]
    text = "LMLM does no worse than Standard on language understanding (3 points at most)"
    if not n:
        return _claim(text, "", "", None)
    a, b = n["lmlm"]["nlu_acc_norm"], n["standard"]["nlu_acc_norm"]
    pa, pb = _chance(n["lmlm"]), _chance(n["standard"])
    ours = f"continuation choice acc_norm {pct(a)} vs {pct(b)}; above chance: p = {fmt(pa, 3)} and {fmt(pb, 3)}"
    testable = pa is not None and pb is not None and pa < P_CHANCE and pb < P_CHANCE
    return _claim(text, f"on par: LLaMA2-176M all-task mean {q['lmlm']} vs {q['standard']}",
                  ours + ("" if testable else " (untestable: a model at chance)"),
                  a >= b - 0.03 if testable else None,
                  f"LMLM >= Standard - 0.03, both above chance (binomial p < {P_CHANCE})",
                  f"{int(n['lmlm']['nlu_n'])} items")


def _tofu(stages: dict) -> list[dict]:
    t = stages.get("tofu")
    if not t:
        return [_claim("Deleting from the KB forgets (forget quality > 0.05) at no utility cost", "", "", None)]
    thr = PAPER["tofu"]["forget_quality_threshold"]
    m = t["models"]
    before, after = m["lmlm_full"], m["lmlm_unlearned"]
    fq0 = before.get("forget_quality")
    per = t.get("seeds", {}).get("per_seed", {})
    fqs = [s["unlearned"].get("forget_quality") for s in per.values()] or [after.get("forget_quality")]
    v = t.get("verdict", {})
    nf = t.get("seeds", {}).get("n_forget")
    ours = (f"{fmt(fq0, 3)} -> " + ", ".join(fmt(x, 3) for x in fqs) + f" over {len(fqs)} seed(s) in "
            f"{t['deletion']['seconds'] * 1000:.0f} ms")
    if v:
        ours += f"; null (retain vs retain, other seed): {', '.join(fmt(x, 3) for x in v.get('null', []))}; " \
                f"value tokens only: {', '.join(fmt(x, 3) for x in v.get('after_values', []))}; verdict: {v['label']}"
    out = [_claim("LMLM forgets by a KB delete: forget quality above 0.05",
                  "forget quality p > 0.05 with no training (forget 5%)", ours,
                  None if fq0 is not None and fq0 > thr  # nothing known to forget
                  else all(x is not None and x > thr for x in fqs),
                  f"KS p > {thr} in every seed", f"{nf} forget questions" if nf else "", len(fqs)),
           _claim("...with no loss of model utility (unchanged by construction: a KB delete changes no weight and "
                  "no utility fact)", "utility unchanged",
                  f"{fmt(before['model_utility'], 3)} -> {fmt(after['model_utility'], 3)}",
                  after["model_utility"] >= before["model_utility"] - 0.01, "at most 0.01 lower"),
           _claim("...and with retain-set answers untouched", "LMLM keeps retain-set performance; "
                  "training-based methods lose some", f"retain probability {fmt(before['tofu_retain_prob'], 3)} -> "
                  f"{fmt(after['tofu_retain_prob'], 3)}",
                  abs(after["tofu_retain_prob"] - before["tofu_retain_prob"]) <= 0.01, "within 0.01")]
    for name, run in t.get("unlearning_runs", {}).items():
        traj = run["trajectory"]
        if not traj:
            continue
        start, end = traj[0], traj[-1]
        # the first point where it forgets (forget quality above the threshold), else the end of the run
        point = next((r for r in traj[1:] if (r.get("forget_quality") or 0.0) > thr), end)
        method = name.rsplit("-", 1)[0].upper()
        f0, f1 = start.get("forget_quality"), point.get("forget_quality")
        out.append(_claim(f"{method} on the Standard model costs utility by the time it forgets",
                          "NPO's utility degrades while forget quality rises",
                          f"step {point['step']} ({'first above ' + str(thr) if point is not end else 'end of run'}): "
                          f"forget quality {fmt(f0, 3)} -> {fmt(f1, 3)}, utility {fmt(start['model_utility'], 3)} -> "
                          f"{fmt(point['model_utility'], 3)}",
                          _ok(f0) and _ok(f1) and f1 > f0 and point["model_utility"] < start["model_utility"] - MARGIN,
                          f"forget quality up and utility down by > {MARGIN}"))
        out.append(_claim(f"{method} also lowers the retain set's answers (entangled parameters)",
                          "training-based methods degrade retain-set performance",
                          f"retain probability {fmt(start['tofu_retain_prob'], 3)} -> {fmt(end['tofu_retain_prob'], 3)}",
                          end["tofu_retain_prob"] < start["tofu_retain_prob"] - 0.01, "lower by > 0.01"))
    return out


def _monotone(vals: list[float], sign: int, tol: float) -> bool:
    """Every step goes the claimed way (``sign`` +1 up, -1 down) or ties within ``tol``; end beyond start by ``tol``."""
    steps = all(sign * (b - a) >= -tol for a, b in zip(vals, vals[1:]))
    return steps and sign * (vals[-1] - vals[0]) > tol


def _offloading(stages: dict) -> list[dict]:
    rows = sorted(stages.get("offloading", {}).get("ratios", []), key=lambda r: r["ratio"])
    if len(rows) < 2:
        return [_claim("More offloading lowers perplexity and raises factual precision", "", "", None)]
    ratios = "/".join(f"{r['ratio']:.0%}" for r in rows)
    s = _seed_summary(stages)
    sd_ppl = (s.get("ppl_dynamic") or {}).get("sd") or 0.0
    sd_em = (s.get("trex_lmlm") or {}).get("sd") or 0.0
    tol_ppl, tol_em = 2 * sd_ppl, max(MARGIN, 2 * sd_em)
    key = "perplexity_dynamic" if all("perplexity_dynamic" in r for r in rows) else "perplexity_static"
    ppl = [r[key] for r in rows]
    em = [r["trex_exact_match"] for r in rows]
    nlu = [r["nlu_acc_norm"] for r in rows]
    pvals = [(r.get("nlu_above_chance") or {}).get("p_value") for r in rows]
    testable = all(p is not None and p < P_CHANCE for p in pvals)
    docs = rows[-1].get("heldout_documents")
    return [_claim(f"More offloading lowers perplexity ({key.split('_')[1]})", "consistently, 0% to 100%",
                   f"{ratios}: " + " ".join(f"{v:.3g}" for v in ppl), _monotone(ppl, -1, tol_ppl),
                   f"every step down or within {tol_ppl:.3f} (2 sd over seeds), 0% to 100% down by more",
                   f"{docs} held-out documents"),
            _claim("More offloading raises factual precision", "consistently, 0% to 100%",
                   "T-REx EM " + " ".join(f"{v:.3g}" for v in em), _monotone(em, +1, tol_em),
                   f"every step up or within {tol_em:.3f}, 0% to 100% up by more", _n(stages, "trex")),
            _claim("...while language understanding is preserved", "NLU flat across ratios",
                   "continuation acc_norm " + " ".join(f"{v:.3f}" for v in nlu)
                   + ("" if testable else " (untestable: a ratio at chance)"),
                   max(nlu) - min(nlu) <= 0.05 if testable else None,
                   f"range at most 0.05, every ratio above chance (p < {P_CHANCE})",
                   f"{int(rows[0].get('nlu_n') or 0)} items")]


def _knowledge(stages: dict) -> dict:
    u = stages.get("bios", {}).get("unlearning")
    if not u:
        return _claim("Deleted facts are gone at once; other facts stay", "", "", None)
    return _claim("Deleted facts are gone at once; other facts stay (biography KB)", "section 4.2 (instant forgetting)",
                  f"forget {pct(u['forget_before'])} -> {pct(u['forget_after'])}, retain {pct(u['retain_before'])} -> "
                  f"{pct(u['retain_after'])}",
                  None if u["forget_before"] < 0.05 else  # nothing was known: nothing to forget
                  u["forget_after"] <= 0.05 and abs(u["retain_after"] - u["retain_before"]) <= 0.02,
                  "forget at most 5%, retain within 2 points", f"{u['forget_prompts']} forget, "
                  f"{u['retain_prompts']} retain prompts")


def check_claims(stages: dict) -> list[dict]:
    """All checks, in the order of the paper."""
    return [_perplexity(stages), *_factual(stages), _prefix_tree(stages), *_rag(stages), _nlu(stages),
            *_tofu(stages), _knowledge(stages), *_offloading(stages)]
