"""The reproduction report: ``report.md`` with PNG figures, each result beside the paper's number.

Figures: the paper's perplexity comparison (all held-out documents and by group), factual
precision with and without the database and on stated vs KB-only facts, prefix-tree vs fuzzy, RAG
with both readers, TOFU's forget quality vs model utility with the unlearning trajectories, and the
offloading curves. The Markdown sections are in :mod:`lmlm.reproduce.sections`.
"""

from __future__ import annotations

import math
from pathlib import Path

from .sections import (claims_section, closing, factual_section, metrics_of, offloading_section, perplexity_section,
                       rag_section, tofu_section)

__all__ = ["write_reproduction_report"]


def _plt():
    from ..report import plt_module

    return plt_module()


def _num(x) -> float:
    return 0.0 if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _grouped(path: Path, groups: list[str], series: dict[str, list], ylabel: str, title: str, percent=False) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / max(1, len(series))
    for k, (name, vals) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))]
        vals = [_num(v) * (100 if percent else 1) for v in vals]
        ax.bar(xs, vals, width, label=name)
        for x, v in zip(xs, vals):
            ax.text(x, v, f"{v:.1f}" if percent else f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _metrics(stages: dict, system: str, reader: str | None = None) -> list:
    return metrics_of(stages, system, reader)


def _tofu_plot(tofu: dict, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    m = tofu["models"]
    floor = 1e-12
    for name, run in tofu["unlearning_runs"].items():
        traj = run["trajectory"]
        xs = [r["model_utility"] for r in traj]
        ys = [max(floor, r.get("forget_quality") or floor) for r in traj]
        ax.plot(xs, ys, marker="o", ms=3, label=f"Standard + {name.rsplit('-', 1)[0].upper()} (steps 0-{traj[-1]['step']})")
        ax.annotate("start", (xs[0], ys[0]), fontsize=7)
    a, b = m["lmlm_full"], m["lmlm_unlearned"]
    ax.annotate("", xy=(b["model_utility"], max(floor, b["forget_quality"] or floor)),
                xytext=(a["model_utility"], max(floor, a["forget_quality"] or floor)),
                arrowprops=dict(arrowstyle="->", color="tab:purple", lw=2))
    ax.scatter([a["model_utility"]], [max(floor, a["forget_quality"] or floor)], color="tab:purple", marker="s",
               label="LMLM before delete")
    ax.scatter([b["model_utility"]], [max(floor, b["forget_quality"] or floor)], color="tab:purple", marker="*", s=140,
               label="LMLM after KB delete")
    for key, label, color in (("standard_retain", "Standard retain model", "tab:gray"),
                              ("lmlm_retain", "LMLM retain model", "tab:pink")):
        ax.scatter([m[key]["model_utility"]], [1.0], color=color, marker="D", label=label)
    ax.axhline(0.05, ls="--", color="k", lw=0.8)
    ax.text(ax.get_xlim()[0], 0.06, " p = 0.05", fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("model utility")
    ax.set_ylabel("forget quality (KS p-value)")
    ax.set_title(f"TOFU {tofu['forget_split']}: forget quality vs utility", fontsize=10)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _offloading_plot(rows: list[dict], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
    xs = [100 * r["ratio"] for r in rows]
    ppl = "perplexity_dynamic" if all("perplexity_dynamic" in r for r in rows) else "perplexity_static"
    for ax, key, label in zip(axes, (ppl, "trex_exact_match", "nlu_acc_norm"),
                              (f"held-out perplexity, {ppl.split('_')[1]} (lower is better)", "T-REx EM, no forced lookup",
                               "continuation acc_norm (NLU stand-in)")):
        ax.plot(xs, [r[key] for r in rows], marker="o")
        ax.set_xlabel("facts offloaded (%)")
        ax.set_title(label, fontsize=9)
    fig.suptitle("Selective offloading by loss difference (0% = Standard, 100% = LMLM)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _figures(stages: dict, fig: Path) -> None:
    fig.mkdir(parents=True, exist_ok=True)
    p = stages["bios"]["perplexity"]
    rows = {"all": {**p["lmlm"], "standard": p["standard"]}, **p.get("by_group", {})}
    _grouped(fig / "perplexity.png", ["static", "dynamic", "normalized"],
             {f"Standard ({g})" if g != "all" else "Standard": [r["standard"]] * 3 for g, r in rows.items()}
             | {f"LMLM ({g})" if g != "all" else "LMLM": [r[k] for k in ("static", "dynamic", "normalized")]
                for g, r in rows.items()},
             "perplexity", "Held-out perplexity, all documents and by group (lower is better)")
    groups = ["FactScore", "T-REx EM", "PopQA Acc"]
    _grouped(fig / "factual_precision.png", groups + ["T-REx stated", "T-REx KB only", "PopQA stated", "PopQA KB only"],
             {name: _metrics(stages, key) + _stated_values(stages, key)
              for key, name in (("standard", "Standard"), ("lmlm_no_db", "LMLM w/o DB"),
                                ("lmlm_calls_stripped", "LMLM calls stripped"), ("lmlm", "LMLM"))
              if key in stages["factual"]["systems"]},
             "%", "Factual precision, the database ablation, stated vs KB-only facts", percent=True)
    _grouped(fig / "prefix_tree.png", groups,
             {"LMLM prefix-tree": _metrics(stages, "lmlm_prefix_tree"), "LMLM fuzzy": _metrics(stages, "lmlm")},
             "%", "Prefix-tree constrained vs fuzzy-matched queries", percent=True)
    if "rag" in stages:
        series = {"Standard": _metrics(stages, "standard")}
        readers = stages["rag"].get("readers") or {"standard": None}
        for reader in readers:
            label = "Standard + RAG" if reader == "standard" else "RAG reader (trained with passages)"
            series[label] = _metrics(stages, "rag", reader if stages["rag"].get("readers") else None)
        series["LMLM"] = _metrics(stages, "lmlm")
        _grouped(fig / "rag.png", groups, series, "%", "RAG (BM25 top-k), two readers, vs LMLM", percent=True)
    if "tofu" in stages:
        _tofu_plot(stages["tofu"], fig / "tofu.png")
    if stages.get("offloading", {}).get("ratios"):
        _offloading_plot(sorted(stages["offloading"]["ratios"], key=lambda r: r["ratio"]), fig / "offloading.png")


def _stated_values(stages: dict, system: str) -> list:
    b = stages["factual"]["systems"].get(system, {}).get("by_stated", {})
    return [b.get(p, {}).get(g) for p in ("trex", "popqa") for g in ("stated", "kb_only")]


def write_reproduction_report(report: dict, out: str | Path) -> Path:
    """Write ``out/report.md`` and ``out/figures/*.png`` from a reproduction report dict."""
    out = Path(out)
    stages = {**report["stages"], "config": report["config"]}
    _figures(stages, out / "figures")
    claims = report["claims"]
    lines = [f"# lmlm reproduction report (preset `{report['preset']}`)", "",
             "The paper's protocols on the embedded worlds: a synthetic biography world (pretraining, factual "
             "precision, perplexity, offloading, RAG) and a fictitious-authors world in TOFU's files (unlearning). "
             f"Models: {_params(stages['bios']['models']['lmlm'])}, trained with the `{report['config']['bios']}` "
             "quickstart recipe (details of the biography run in `bios/report.md`).", ""]
    lines += claims_section(claims) + perplexity_section(stages) + factual_section(stages)
    if stages["bios"].get("wrong_entity"):
        from ..report import wrong_entity_lines

        lines += wrong_entity_lines(stages["bios"])
    if "rag" in stages:
        lines += rag_section(stages)
    if "tofu" in stages:
        lines += tofu_section(stages["tofu"])
    if stages.get("offloading", {}).get("ratios"):
        lines += offloading_section(stages["offloading"])
    lines += closing(claims) + ["## Time", "", ", ".join(f"{k}: {v:.0f} s" for k, v in report["timings_seconds"].items()), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _params(model: dict) -> str:
    p = model.get("parameters")
    total = p.get("total") if isinstance(p, dict) else p
    return f"`{model.get('preset')}`, {total / 1e6:.2f}M parameters, {model.get('steps')} steps" if total else "–"
