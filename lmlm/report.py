"""Reports for people: Markdown with PNG figures, written next to every ``report.json``.

``write_report(report, out)`` renders a quickstart report; ``render_generation`` shows one
generation with its lookups marked, ``⟦Entity · Relation → value⟧``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["write_report", "render_generation", "plot_training_curves"]


def _fmt(x: Any, digits: int = 3) -> str:
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


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training_curves(runs: dict[str, Path], path: Path) -> bool:
    """Training loss per step for each run folder that has a ``train_log.jsonl``."""
    plt = _plt()
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
    plt = _plt()
    fp = report["factual_precision"]
    buckets = ["1", "2-4", "5+"]
    systems = [("lmlm", "LMLM"), ("lmlm_no_db", "LMLM, no DB"), ("standard", "Standard")]
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    width = 0.26
    for k, (key, label) in enumerate(systems):
        vals = [fp["by_mentions"][b][key] or 0.0 for b in buckets] + [fp[key]]
        xs = [i + (k - 1) * width for i in range(len(vals))]
        ax.bar(xs, vals, width, label=label)
    ax.set_xticks(range(4), [f"{b} mention{'s' if b != '1' else ''}" for b in buckets] + ["all"])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("factual precision")
    ax.set_title("Cloze factual precision by how often a person was seen in training")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _labelled_bars(path: Path, labels, vals, colors, ylabel: str, title: str, ylim=None, size=(6, 3.5)) -> None:
    """One bar per value, each labelled with its value."""
    plt = _plt()
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
    _labelled_bars(path, ["LMLM static", "LMLM dynamic", "LMLM normalized", "Standard"],
                   [p["lmlm"]["static"], p["lmlm"]["dynamic"], p["lmlm"]["normalized"], p["standard"]],
                   ["tab:blue", "tab:cyan", "tab:purple", "tab:orange"],
                   "perplexity (held-out documents)", "Held-out perplexity (lower is better)")


def write_report(report: dict, out: str | Path) -> Path:
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
        "| people seen in training | prompts | LMLM | LMLM without DB | Standard |",
        "|---|---:|---:|---:|---:|",
    ]
    for b in ("1", "2-4", "5+"):
        r = fp["by_mentions"][b]
        lines.append(f"| {b} time{'s' if b != '1' else ''} | {fp['mention_counts'][b]} | {_fmt(r['lmlm'])} | "
                     f"{_fmt(r['lmlm_no_db'])} | {_fmt(r['standard'])} |")
    lines += [f"| all | {fp['n']} | **{_fmt(fp['lmlm'])}** | {_fmt(fp['lmlm_no_db'])} | {_fmt(fp['standard'])} |",
              "", "![factual precision](figures/factual_precision.png)", "",
              "## Changing what the model knows, with no training", "",
              "| what | prompts | LMLM | Standard |", "|---|---:|---:|---:|",
              f"| people added to the KB after training | {ak['n']} | {_fmt(ak['lmlm'])} | {_fmt(ak.get('standard'))} |",
              f"| facts edited in the KB (new value produced) | {ed['n']} | {_fmt(ed['lmlm'])} | – |",
              f"| edited facts: old value still produced | {ed['n']} | {_fmt(ed.get('lmlm_old_value'))} | – |",
              f"| forget set ({u['people']} people), before delete | {u['forget_prompts']} | {_fmt(u['forget_before'])} | {_fmt(u.get('standard_forget'))} |",
              f"| forget set, after delete | {u['forget_prompts']} | **{_fmt(u['forget_after'])}** | {_fmt(u.get('standard_forget'))} |",
              f"| retain set, before delete | {u['retain_prompts']} | {_fmt(u['retain_before'])} | – |",
              f"| retain set, after delete | {u['retain_prompts']} | {_fmt(u['retain_after'])} | – |",
              "",
              f"Deleting {u['facts_deleted']} facts of {u['people']} people took {u['seconds']:.3f} s.",
              "", "![knowledge changes](figures/knowledge_changes.png)", "",
              "## Held-out perplexity (paper, appendix A.3)", "",
              "| LMLM static | LMLM dynamic | LMLM normalized | Standard |", "|---:|---:|---:|---:|",
              f"| {_fmt(p['lmlm']['static'], 2)} | {_fmt(p['lmlm']['dynamic'], 2)} | {_fmt(p['lmlm']['normalized'], 2)} "
              f"| {_fmt(p['standard'], 2)} |", "",
              f"{p['documents']} documents, {p['org_tokens']} text tokens. In the dynamic setting the model wrote "
              f"{p['lmlm'].get('dynamic_lookups')} queries, {_fmt(p['lmlm'].get('dynamic_lookup_found_rate'))} "
              "of them found in the KB. LMLM loss per token role: "
              + ", ".join(f"{k} {v:.2f}" for k, v in p["lmlm"]["role_loss"].items()) + ".",
              "", "![perplexity](figures/perplexity.png)", "",
              "## Models", "", "| model | preset | parameters | steps | tokens seen | trained tokens | seconds | final loss |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for k in ("lmlm", "standard"):
        r = m[k]
        params = r.get("parameters")
        params = params.get("total") if isinstance(params, dict) else params
        lines.append(f"| {k} | {r['preset']} | {_fmt(params)} | {_fmt(r.get('steps'))} | {_fmt(r.get('training_tokens'))} "
                     f"| {_fmt(r.get('trained_tokens'))} | {_fmt(r.get('training_seconds'), 0)} | {_fmt(r.get('final_loss'))} |")
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
