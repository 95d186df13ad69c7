"""Reports for people: Markdown with PNG figures, written next to every ``report.json``.

``write_quickstart_report(report, out)`` renders a quickstart report; ``render_generation`` shows one
generation with its lookups marked, ``⟦Entity · Relation → value⟧``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .jsonio import write_json  # re-exported: lmlm.report.write_json is public

__all__ = ["write_json", "write_quickstart_report", "render_generation", "plot_training_curves", "plot_protocols",
           "wrong_entity_lines"]


def fmt_value(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def render_generation(text: str) -> str:
    """Mark each ``[dblookup('E', 'R') -> V]`` call of a generation as ``⟦E · R → V⟧`` in bold."""
    from .lookup import Lookup, parse

    out = []
    for k, seg in enumerate(parse(text).segments):
        if isinstance(seg, Lookup):
            if k == 0:
                out.append(" ")
            out.append(f"**⟦{seg.entity} · {seg.relation} → {seg.value}⟧**")
        else:
            out.append(seg.text.replace("*", "\\*"))
    return "".join(out)


def plt_module():
    """matplotlib's pyplot drawing to files (the ``plots`` extra; a missing one is named)."""
    from .errors import need

    need("matplotlib", "plots", "the report's figures").use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training_curves(runs: dict[str, Path], path: Path) -> bool:
    """Training loss per step for each run folder that has a ``train_log.jsonl``."""
    plt = plt_module()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    any_curve = False
    for name, run in runs.items():
        log = run / "train_log.jsonl"
        if not log.exists():
            continue
        rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if "loss" in r and "step" in r]
        if rows:
            ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=name)
            any_curve = True
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (trained tokens)")
    ax.set_title("Training loss (LMLM's loss excludes values)")
    ax.legend()
    fig.tight_layout()
    if any_curve:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return any_curve


def _bar_precision(report: dict, path: Path) -> None:
    plt = plt_module()
    fp = report["factual_precision"]
    buckets = ["1", "2-4", "5+"]
    systems = [("lmlm", "LMLM"), ("lmlm_no_db", "LMLM, no DB"), ("standard", "Standard")]
    split = fp.get("by_stated", {})
    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.26
    for k, (key, label) in enumerate(systems):
        vals = [fp["by_mentions"][b][key] or 0.0 for b in buckets] + [fp[key]]
        vals += [split[g][key] or 0.0 for g in ("stated", "kb_only") if g in split]
        xs = [i + (k - 1) * width for i in range(len(vals))]
        ax.bar(xs, vals, width, label=label)
    labels = [f"{b} mention{'s' if b != '1' else ''}" for b in buckets] + ["all"]
    labels += [lbl for g, lbl in (("stated", "stated in\ntraining text"), ("kb_only", "KB only")) if g in split]
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("factual precision")
    ax.set_title("Cloze factual precision by how often a person was seen in training")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _labelled_bars(path: Path, labels, vals, colors, ylabel: str, title: str, ylim=None, size=(6, 3.5)) -> None:
    """One bar per value, each labelled with its value."""
    plt = plt_module()
    fig, ax = plt.subplots(figsize=size)
    ax.bar(range(len(vals)), vals, color=colors)
    top = ylim[1] if ylim else max(vals)
    for i, v in enumerate(vals):
        ax.text(i, v + 0.02 * top, f"{v:.2f}", ha="center", fontsize=8)
    ax.set_xticks(range(len(vals)), labels, fontsize=8)
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _bar_knowledge(report: dict, path: Path) -> None:
    u = report["unlearning"]
    _labelled_bars(
        path,
        ["added to KB\nafter training", "edited\n(new value)", "forget set\nbefore", "forget set\nafter",
         "retain set\nbefore", "retain set\nafter"],
        [report["added_knowledge"]["lmlm"], report["edits"]["lmlm"], u["forget_before"], u["forget_after"],
         u["retain_before"], u["retain_after"]],
        ["tab:green", "tab:green", "tab:gray", "tab:red", "tab:gray", "tab:blue"],
        "LMLM precision", f"Changing what the model knows, with no training (forget: {u['seconds'] * 1000:.0f} ms)",
        ylim=(0, 1.1), size=(7, 3.5))


def _bar_perplexity(report: dict, path: Path) -> None:
    p = report["perplexity"]
    plt = plt_module()
    rows = [("all", {**p["lmlm"], "standard": p["standard"]})] + list(p.get("by_group", {}).items())
    keys = [("static", "LMLM static", "tab:blue"), ("dynamic", "LMLM dynamic", "tab:cyan"),
            ("normalized", "LMLM normalized", "tab:purple"), ("standard", "Standard", "tab:orange")]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.2
    for k, (key, label, color) in enumerate(keys):
        xs = [i + (k - 1.5) * width for i in range(len(rows))]
        vals = [r[key] for _, r in rows]
        ax.bar(xs, vals, width, label=label, color=color)
        for x, v in zip(xs, vals):
            ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)), [f"{g} documents" if g == "all" else f"{g} people" for g, _ in rows])
    ax.set_ylabel("perplexity (held-out documents)")
    ax.set_title("Held-out perplexity (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _ratio(row: dict | None, n: str = "n") -> str:
    return "–" if not row else f"{row['wrong']} / {row[n]}"


def wrong_entity_lines(report: dict) -> list[str]:
    """The table of lookups answered for someone else: the default decoding (entity-aware matching, both
    biases) beside plain decoding with entity-aware matching and with the paper's single-key match."""
    w = report.get("wrong_entity")
    if not w:
        return []
    fp, ak, u = report["factual_precision"], report["added_knowledge"], report["unlearning"]
    d, a, c = w["deleted"], w["absent"], w["cloze"]
    dp, ap, cp = d.get("plain"), a.get("plain"), c.get("plain")

    def lookups(row):
        return _ratio(row, "lookups")

    def share(row):
        return f"{lookups(row)} ({fmt_value(row.get('share'))})" if row else "–"

    rows = [
        ("factual precision (cloze)", fmt_value(fp["lmlm"]), fmt_value(fp.get("lmlm_plain")), fmt_value(fp.get("lmlm_paper"))),
        ("people added to the KB after training", fmt_value(ak["lmlm"]), fmt_value(ak.get("lmlm_plain")),
         fmt_value(ak.get("lmlm_paper"))),
        ("forget set, after delete", fmt_value(u["forget_after"]), fmt_value(u.get("forget_after_plain")),
         fmt_value(u.get("forget_after_paper"))),
        ("retain set, before / after delete", f"{fmt_value(u['retain_before'])} / {fmt_value(u['retain_after'])}",
         f"{fmt_value(u.get('retain_before_plain'))} / {fmt_value(u.get('retain_after_plain'))}",
         f"{fmt_value(u.get('retain_before_paper'))} / {fmt_value(u.get('retain_after_paper'))}"),
        ("`wrong_entity.deleted`: keys of deleted people looked up", _ratio(d), _ratio(dp), _ratio(d.get("paper"))),
        ("... their cloze lookups after the delete", lookups(d["generated"]), lookups((dp or {}).get("generated")),
         lookups(d.get("paper", {}).get("generated"))),
        ("`wrong_entity.absent`: keys of people never in the KB", _ratio(a), _ratio(ap), _ratio(a.get("paper"))),
        ("... their cloze lookups", lookups(a["generated"]), lookups((ap or {}).get("generated")),
         lookups(a.get("paper", {}).get("generated"))),
        ("`wrong_entity.cloze`: cloze lookups answered from another entity", share(c), share(cp),
         share(c.get("paper"))),
    ]
    misses = ", ".join(f"{k} {v}" for k, v in sorted(c["misses"]["by_reason"].items())) or "none"
    return ["## Lookups answered for someone else", "",
            "The quickstart's decoding (entity-aware matching: the entity first, by exact name, alias, the names "
            "in the text so far, then a fuzzy match with a margin; then the relation among its keys; decoded with "
            f"`--name-bias {fp.get('name_bias') or 0:g} --copy-bias {ak.get('copy_bias') or 0:g}`) beside the "
            "paper's plain decoding, with entity-aware matching and with the paper's single-key cosine (0.6), "
            "on the same model and KB (the key rows look up the same keys, without decoding).", "",
            "| what | entity-aware, both biases (default) | entity-aware, plain decoding "
            "| paper's single-key match, plain decoding |", "|---|---:|---:|---:|",
            *[f"| {' | '.join(r)} |" for r in rows], "",
            f"Why the default's cloze lookups missed: {misses}.", ""]


def _added_lines(ak: dict) -> list[str]:
    """Why the added-knowledge items missed, and the same items with the copy bias."""
    lines = []
    wa = ak.get("wrong_answers")
    if wa:
        misses = ", ".join(f"{k} {v}" for k, v in sorted(ak.get("misses", {}).get("by_reason", {}).items())) or "none"
        lines.append(f"Added knowledge: {wa['n']} of {ak['n']} items missed: {wa['no_answer']} where no lookup was "
                     f"answered (lookup misses by reason: {misses}), {wa['lookup_answered']} where the KB answered "
                     "and the text after the call did not state the value.")
    if ak.get("lmlm_plain") is not None:
        lines.append(f"Decoded with both biases (the default above: `--name-bias {ak['name_bias']:g}` keeps a query's "
                     f"entity on the KB names the text gives, `--copy-bias {ak['copy_bias']:g}` favours the answered "
                     f"value's next token while the text states it) the LMLM states {fmt_value(ak['lmlm'])} of them; "
                     f"the paper's plain decoding {fmt_value(ak['lmlm_plain'])}.")
    return lines


def plot_protocols(section: dict | None, path: str | Path) -> bool:
    """Efficacy and neighbourhood against the number of sequential edits, one line per method; ``False``
    (nothing drawn) when the section has no editing rows."""
    methods = {name: rows for name in ("lmlm", "ft-l")
               if (rows := ((section or {}).get("editing") or {}).get(name, {}).get("rows"))}
    plt = plt_module() if methods else None
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    labels = {"lmlm": "LMLM (KB edit)", "ft-l": "FT-L (weights)"}
    for ax, key, title in zip(axes, ("efficacy_accuracy", "neighborhood_unchanged"),
                              ("efficacy (new value stated)", "neighbourhood unchanged")):
        for name, rows in methods.items():
            pts = [(r["edits"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=labels[name])
        ax.set_xscale("log")
        ax.set_xlabel("sequential edits")
        ax.set_title(title)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="center right")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _protocol_lines(section: dict | None, fig_dir: Path) -> list[str]:
    """The editing and forgetting protocols' section, with its figure."""
    from .evaluate.protocols import protocol_lines

    lines = protocol_lines(section)
    if lines and plot_protocols(section, fig_dir / "editing.png"):
        lines += ["![sequential edits](figures/editing.png)", ""]
    return lines


def write_quickstart_report(report: dict, out: str | Path) -> Path:
    """Write ``out/report.md`` and its figures from a quickstart report dict."""
    out = Path(out)
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    _bar_precision(report, fig_dir / "factual_precision.png")
    _bar_knowledge(report, fig_dir / "knowledge_changes.png")
    _bar_perplexity(report, fig_dir / "perplexity.png")
    has_curves = plot_training_curves({"LMLM": out / "train-lmlm", "Standard": out / "train-standard"},
                                      fig_dir / "training_loss.png")
    fp, ak, ed, u, p, m = (report[k] for k in ("factual_precision", "added_knowledge", "edits", "unlearning",
                                               "perplexity", "models"))
    w = report["world"]
    lines = [
        f"# lmlm quickstart report (preset `{report['preset']}`)",
        "",
        "A synthetic biography world; two models of the same size, tokenizer, block order and training "
        "budget: **LMLM** (trained on text with lookup calls, values masked from the loss) and "
        "**Standard** (trained on the same text without lookups).",
        "",
        f"World: {json.dumps(w)}",
        "",
        "## Factual precision (cloze prompts, gold value within the first 5 words, lookups stripped)",
        "",
        "| people seen in training | prompts | of them KB only | LMLM | LMLM without DB | Standard | Standard, stated facts |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    mst = fp.get("by_mentions_stated", {})
    for b in ("1", "2-4", "5+"):
        r, rs = fp["by_mentions"][b], mst.get(b, {})
        lines.append(f"| {b} time{'s' if b != '1' else ''} | {fp['mention_counts'][b]} | {fmt_value(rs.get('kb_only_prompts'))} "
                     f"| {fmt_value(r['lmlm'])} | {fmt_value(r['lmlm_no_db'])} | {fmt_value(r['standard'])} | {fmt_value(rs.get('standard'))} |")
    sc = fp.get("stated_counts", {})
    lines += [f"| all | {fp['n']} | {fmt_value(sc.get('kb_only'))} | **{fmt_value(fp['lmlm'])}** | {fmt_value(fp['lmlm_no_db'])} "
              f"| {fmt_value(fp['standard'])} | {fmt_value(fp.get('by_stated', {}).get('stated', {}).get('standard'))} |", ""]
    if fp.get("lmlm_plain") is not None:
        lines += [f"The LMLM decodes with `lmlm generate --name-bias {fp['name_bias']:g} --copy-bias "
                  f"{fp['copy_bias']:g}` (a query's entity kept on the KB names the text gives; the answered value "
                  f"favoured while the text states it). The paper's plain decoding: {fmt_value(fp['lmlm_plain'])}.", ""]
    if "by_stated" in fp:
        bs = fp["by_stated"]
        lines += ["Facts stated in some training document vs facts only the KB holds (no training document states "
                  "them, so no Standard model could learn them; the cloze prompts sample both):", "",
                  "| facts | prompts | LMLM | LMLM without DB | Standard |", "|---|---:|---:|---:|---:|"]
        for g, label in (("stated", "stated in training text"), ("kb_only", "KB only")):
            lines.append(f"| {label} | {sc.get(g)} | {fmt_value(bs[g]['lmlm'])} | {fmt_value(bs[g]['lmlm_no_db'])} "
                         f"| {fmt_value(bs[g]['standard'])} |")
        lines.append("")
    lines += ["![factual precision](figures/factual_precision.png)", "",
              "## Changing what the model knows, with no training", "",
              "| what | prompts | LMLM | Standard |", "|---|---:|---:|---:|",
              f"| people added to the KB after training | {ak['n']} | {fmt_value(ak['lmlm'])} | {fmt_value(ak.get('standard'))} |",
              f"| facts edited in the KB (new value produced) | {ed['n']} | {fmt_value(ed['lmlm'])} | – |",
              f"| edited facts: old value still produced | {ed['n']} | {fmt_value(ed.get('lmlm_old_value'))} | – |",
              f"| forget set ({u['people']} people), before delete | {u['forget_prompts']} | {fmt_value(u['forget_before'])} | {fmt_value(u.get('standard_forget'))} |",
              f"| forget set, after delete | {u['forget_prompts']} | **{fmt_value(u['forget_after'])}** | {fmt_value(u.get('standard_forget'))} |",
              f"| retain set, before delete | {u['retain_prompts']} | {fmt_value(u['retain_before'])} | – |",
              f"| retain set, after delete | {u['retain_prompts']} | {fmt_value(u['retain_after'])} | – |",
              "",
              f"Deleting {u['facts_deleted']} facts of {u['people']} people took {u['seconds']:.3f} s.",
              ""] + _added_lines(ak) + ["", "![knowledge changes](figures/knowledge_changes.png)", ""] + wrong_entity_lines(report) + [
              "## Held-out perplexity (paper, appendix A.3)", "",
              "Dynamic perplexity is computed with a KB that holds the facts of every held-out document (the "
              "trained people's and the added people's), as the paper's database covers its validation text.", "",
              "| documents about | documents | LMLM static | LMLM dynamic | LMLM normalized | Standard | queries | "
              "right person found |", "|---|---:|---:|---:|---:|---:|---:|---:|",
              f"| all | {p['documents']} | {fmt_value(p['lmlm']['static'], 2)} | {fmt_value(p['lmlm']['dynamic'], 2)} "
              f"| {fmt_value(p['lmlm']['normalized'], 2)} | {fmt_value(p['standard'], 2)} | {fmt_value(p['lmlm'].get('dynamic_lookups'))} "
              f"| {fmt_value(p['lmlm'].get('dynamic_lookup_found_rate'))} |"]
    for g, r in p.get("by_group", {}).items():
        lines.append(f"| {g} people | {r['documents']} | {fmt_value(r['static'], 2)} | {fmt_value(r['dynamic'], 2)} "
                     f"| {fmt_value(r['normalized'], 2)} | {fmt_value(r['standard'], 2)} | {r['lookups']} "
                     f"| {fmt_value(r['lookup_found_rate'])} |")
    lines += ["", f"{p['org_tokens']} text tokens. A query counts as found only when the KB answered with a fact of "
              f"the person the reference call names; {fmt_value(p['lmlm'].get('dynamic_lookup_matched_rate'))} of the queries "
              f"got some answer, {fmt_value(p['lmlm'].get('dynamic_lookup_wrong_entity'))} of them about someone else. "
              "LMLM loss per token role: " + ", ".join(f"{k} {v:.2f}" for k, v in p["lmlm"]["role_loss"].items()) + ".",
              "", "![perplexity](figures/perplexity.png)", ""]
    lines += _protocol_lines(report.get("protocols"), fig_dir)
    lines += ["## Models", "",
              "| model | preset | parameters | steps | tokens (steps x batch x length) | trained tokens | seconds "
              "| final loss |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for k in ("lmlm", "standard"):
        r = m[k]
        params = r.get("parameters")
        params = params.get("total") if isinstance(params, dict) else params
        lines.append(f"| {k} | {r['preset']} | {fmt_value(params)} | {fmt_value(r.get('steps'))} | {fmt_value(r.get('training_tokens'))} "
                     f"| {fmt_value(r.get('trained_tokens'))} | {fmt_value(r.get('training_seconds'), 0)} | {fmt_value(r.get('final_loss'))} |")
    if has_curves:
        lines += ["", "![training loss](figures/training_loss.png)"]
    lines += ["", "## Sample generations", "",
              "Lookups are marked ⟦entity · relation → value⟧; the value comes from the knowledge base.", ""]
    titles = {"lmlm": "LMLM", "lmlm_no_db": "LMLM without the database", "standard": "Standard",
              "added": "LMLM, person added to the KB after training", "edits": "LMLM, edited fact",
              "forgotten": "LMLM, person deleted from the KB"}
    for key, title in titles.items():
        for s in report["samples"].get(key, []):
            mark = "✔" if s["hit"] else "✘"
            lines.append(f"- *{title}* {mark} (gold: {s['gold']}): {s['prompt']}{render_generation(s['text'])}")
    lines += ["", "## Time", "", ", ".join(f"{k}: {v:.0f} s" for k, v in report["timings_seconds"].items()), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
