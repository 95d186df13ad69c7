"""The paper's qualitative claims, each checked against a reproduction's numbers.

Every check returns the claim, the paper's evidence, ours, and whether it holds here (None when the
run has no number for it). The report's closing note is made of these.
"""

from __future__ import annotations

import math

from .paper import PAPER

MARGIN = 0.005  # half a point: a "better" smaller than this is a tie

__all__ = ["check_claims", "fmt", "metric", "pct"]


def pct(x) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def fmt(x, d: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def metric(stages: dict, system: str, protocol: str) -> float | None:
    key = {"trex": "trex_exact_match", "popqa": "popqa_accuracy", "factscore": "factscore_score"}[protocol]
    if system == "rag":
        m = stages.get("rag", {}).get("metrics", {})
    else:
        m = stages.get("factual", {}).get("systems", {}).get(system, {}).get("metrics", {})
    v = m.get(protocol, {}).get(key)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _claim(text: str, paper: str, ours: str, holds) -> dict:
    return {"claim": text, "paper": paper, "ours": ours, "holds": None if holds is None else bool(holds)}


def _perplexity(stages: dict) -> dict:
    p = stages.get("bios", {}).get("perplexity")
    if not p:
        return _claim("LMLM has lower perplexity than Standard (static, dynamic, normalized)", "", "", None)
    lm, std = p["lmlm"], p["standard"]
    ours = ", ".join(f"{k} {lm[k]:.2f}" for k in ("static", "dynamic", "normalized")) + f" vs Standard {std:.2f}"
    return _claim("LMLM has lower perplexity than Standard in all three variants",
                  f"all sizes; dynamic lower by {PAPER['perplexity']['dynamic_reduction']} on average", ours,
                  all(lm[k] < std for k in ("static", "dynamic", "normalized")))


def _factual(stages: dict) -> list[dict]:
    p = PAPER["factual_precision"]["LLaMA2-176M"]
    out = []
    s = [metric(stages, "standard", k) for k in ("factscore", "trex", "popqa")]
    m = [metric(stages, "lmlm", k) for k in ("factscore", "trex", "popqa")]
    have = all(x is not None for x in s + m)
    out.append(_claim("LMLM beats Standard on FactScore, T-REx EM and PopQA",
                      "LLaMA2-176M: " + ", ".join(f"{a} -> {b}" for a, b in zip(p["standard"], p["lmlm"])),
                      ", ".join(f"{pct(a)} -> {pct(b)}" for a, b in zip(s, m)),
                      all(b > a + MARGIN for a, b in zip(s, m)) if have else None))
    nd = [metric(stages, "lmlm_no_db", k) for k in ("factscore", "trex")]
    q = PAPER["no_database"]["LLaMA2-176M"]
    have = all(x is not None for x in nd + m[:2])
    out.append(_claim("Without its database the LMLM loses most of its factual precision",
                      f"LLaMA2-176M FactScore {q['lmlm'][0]} -> {q['lmlm_no_db'][0]}, T-REx {q['lmlm'][1]} -> {q['lmlm_no_db'][1]}",
                      f"FactScore {pct(m[0])} -> {pct(nd[0])}, T-REx {pct(m[1])} -> {pct(nd[1])}",
                      all(b < a - MARGIN for a, b in zip(m[:2], nd)) if have else None))
    out.append(_claim("...and falls to about the Standard model's level or below",
                      f"T-REx {q['lmlm_no_db'][1]} vs Standard {q['standard'][1]}",
                      f"T-REx {pct(nd[1])} vs Standard {pct(s[1])}",
                      nd[1] <= s[1] + 0.05 if have and s[1] is not None else None))
    return out


def _prefix_tree(stages: dict) -> dict:
    q = PAPER["prefix_tree"]["LLaMA2-176M"]
    f, t = metric(stages, "lmlm", "factscore"), metric(stages, "lmlm_prefix_tree", "factscore")
    return _claim("Fuzzy matching beats prefix-tree constrained queries on FactScore",
                  f"LLaMA2-176M {q['fuzzy'][0]} vs {q['prefix_tree'][0]}", f"{pct(f)} vs {pct(t)}",
                  f > t + MARGIN if f is not None and t is not None else None)


def _rag(stages: dict) -> list[dict]:
    q = PAPER["rag"]
    r = [metric(stages, "rag", k) for k in ("factscore", "trex", "popqa")]
    m = [metric(stages, "lmlm", k) for k in ("factscore", "trex", "popqa")]
    s = [metric(stages, "standard", k) for k in ("factscore", "trex", "popqa")]
    ok = all(x is not None for x in r + m + s)
    return [
        _claim("RAG improves the Standard model", f"GPT2-355M: {q['gpt2_medium']} -> {q['gpt2_medium_rag']}",
               ", ".join(f"{pct(a)} -> {pct(b)}" for a, b in zip(s, r)),
               sum(b > a + MARGIN for a, b in zip(s, r)) >= 2 if ok else None),
        _claim("LMLM beats RAG on FactScore and PopQA", f"{q['lmlm'][0]} vs {q['gpt2_medium_rag'][0]}, "
               f"{q['lmlm'][2]} vs {q['gpt2_medium_rag'][2]}", f"{pct(m[0])} vs {pct(r[0])}, {pct(m[2])} vs {pct(r[2])}",
               m[0] > r[0] + MARGIN and m[2] > r[2] + MARGIN if ok else None),
        _claim("RAG beats LMLM on T-REx", f"{q['gpt2_medium_rag'][1]} vs {q['lmlm'][1]}", f"{pct(r[1])} vs {pct(m[1])}",
               r[1] > m[1] + MARGIN if ok else None),
    ]


def _nlu(stages: dict) -> dict:
    n = stages.get("factual", {}).get("nlu", {}).get("bios_continuation")
    q = PAPER["nlu"]["LLaMA2-176M"]
    if not n:
        return _claim("LMLM matches Standard on NLU", "", "", None)
    a, b = n["lmlm"]["nlu_acc_norm"], n["standard"]["nlu_acc_norm"]
    return _claim("LMLM does no worse than Standard on language understanding (3 points at most)",
                  f"on par: LLaMA2-176M all-task mean {q['lmlm']} vs {q['standard']}",
                  f"continuation choice acc_norm {pct(a)} vs {pct(b)}", a >= b - 0.03)


def _tofu(stages: dict) -> list[dict]:
    t = stages.get("tofu")
    if not t:
        return [_claim("Deleting from the KB forgets (forget quality > 0.05) at no utility cost", "", "", None)]
    m = t["models"]
    before, after = m["lmlm_full"], m["lmlm_unlearned"]
    fq, fq0 = after.get("forget_quality"), before.get("forget_quality")
    out = [_claim("LMLM forgets by a KB delete: forget quality above 0.05",
                  "forget quality p > 0.05 with no training (forget 5%)",
                  f"{fmt(fq0, 3)} -> {fmt(fq, 3)} in {t['deletion']['seconds'] * 1000:.0f} ms",
                  None if fq0 is not None and fq0 > PAPER["tofu"]["forget_quality_threshold"]  # nothing known to forget
                  else fq is not None and fq > PAPER["tofu"]["forget_quality_threshold"]),
           _claim("...with no loss of model utility", "utility unchanged",
                  f"{fmt(before['model_utility'], 3)} -> {fmt(after['model_utility'], 3)}",
                  after["model_utility"] >= before["model_utility"] - 0.01)]
    out.append(_claim("...and with retain-set answers untouched", "LMLM keeps retain-set performance; "
                      "training-based methods lose some", f"retain probability {fmt(before['tofu_retain_prob'], 3)} -> "
                      f"{fmt(after['tofu_retain_prob'], 3)}",
                      abs(after["tofu_retain_prob"] - before["tofu_retain_prob"]) <= 0.01))
    for name, run in t.get("unlearning_runs", {}).items():
        traj = run["trajectory"]
        if not traj:
            continue
        start, best = traj[0], max(traj, key=lambda r: r.get("forget_quality") or 0.0)
        method = name.rsplit("-", 1)[0].upper()
        end = traj[-1]
        out.append(_claim(f"{method} on the Standard model costs utility by the time it forgets",
                          "NPO's utility degrades while forget quality rises",
                          f"forget quality {fmt(start.get('forget_quality'), 3)} -> best {fmt(best.get('forget_quality'), 3)} "
                          f"(step {best['step']}), utility {fmt(start['model_utility'], 3)} -> {fmt(best['model_utility'], 3)}",
                          best["model_utility"] < start["model_utility"]))
        out.append(_claim(f"{method} also lowers the retain set's answers (entangled parameters)",
                          "training-based methods degrade retain-set performance",
                          f"retain probability {fmt(start['tofu_retain_prob'], 3)} -> {fmt(end['tofu_retain_prob'], 3)}",
                          end["tofu_retain_prob"] < start["tofu_retain_prob"] - 0.01))
    return out


def _offloading(stages: dict) -> list[dict]:
    rows = sorted(stages.get("offloading", {}).get("ratios", []), key=lambda r: r["ratio"])
    if len(rows) < 2:
        return [_claim("More offloading lowers perplexity and raises factual precision", "", "", None)]

    def trend(key: str, sign: int) -> tuple[bool, str]:
        vals = [r[key] for r in rows]
        steps = sum(sign * (b - a) > 0 for a, b in zip(vals, vals[1:]))
        return sign * (vals[-1] - vals[0]) > 0 and steps >= (len(vals) - 1) / 2, " ".join(f"{v:.3g}" for v in vals)

    ratios = "/".join(f"{r['ratio']:.0%}" for r in rows)
    ppl_ok, ppl = trend("perplexity_static", -1)
    em_ok, em = trend("trex_exact_match", +1)
    nlu = [r["nlu_acc_norm"] for r in rows]
    return [_claim("More offloading lowers perplexity", "consistently, 0% to 100%", f"{ratios}: {ppl}", ppl_ok),
            _claim("More offloading raises factual precision", "consistently, 0% to 100%", f"T-REx EM {em}", em_ok),
            _claim("...while language understanding is preserved", "NLU flat across ratios",
                   "continuation acc_norm " + " ".join(f"{v:.3f}" for v in nlu), max(nlu) - min(nlu) <= 0.05)]


def _knowledge(stages: dict) -> dict:
    u = stages.get("bios", {}).get("unlearning")
    if not u:
        return _claim("Deleted facts are gone at once; other facts stay", "", "", None)
    return _claim("Deleted facts are gone at once; other facts stay (biography KB)", "section 4.2 (instant forgetting)",
                  f"forget {pct(u['forget_before'])} -> {pct(u['forget_after'])}, retain {pct(u['retain_before'])} -> "
                  f"{pct(u['retain_after'])}",
                  None if u["forget_before"] < 0.05 else  # nothing was known: nothing to forget
                  u["forget_after"] <= 0.05 and abs(u["retain_after"] - u["retain_before"]) <= 0.02)


def check_claims(stages: dict) -> list[dict]:
    """All checks, in the order of the paper."""
    return [_perplexity(stages), *_factual(stages), _prefix_tree(stages), *_rag(stages), _nlu(stages),
            *_tofu(stages), _knowledge(stages), *_offloading(stages)]
