"""The pipeline's report: ``report.json`` for machines, ``report.md`` with figures for people."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from ..evaluate.base import wilson_interval
from ..jsonio import write_json
from ..report import fmt_value, plot_protocols, plt_module, plot_training_curves, render_generation
from .annotation import METHOD_NAMES
from .recipe import Recipe

__all__ = ["write_pipeline_report", "MODEL_NAMES"]

SPLIT_NAMES = {"train": "train articles", "heldout": "held-out articles", "heldout_infobox": "held-out infoboxes",
               "facts": "entities in no article"}
MODEL_NAMES = {"lmlm": "LMLM", "lmlm_free": "LMLM, decoding freely (no lookup forced)",
               "lmlm_constrained": "LMLM, queries constrained to KB keys",
               "lmlm_no_kb": "LMLM without KB", "standard": "Standard", "base": "base model (untouched)"}


def _cloze_rows(table: dict[str, dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    rows = []
    for model, splits in table.items():
        row: dict[str, Any] = {"model": model}
        for split, m in splits.items():
            n, p = int(m.get("trex_n", 0)), m.get("trex_exact_match")
            row[split] = {"precision": p, "precision_ci95": list(wilson_interval(round(p * n), n)) if p is not None
                          and n else None, "precision_at_1": m.get("trex_precision_at_1"), "n": n,
                          "lookup_found": m.get("trex_lookup_found"), "names_subject": m.get("trex_lookup_names_subject")}
        rows.append(row)
    return rows


def _call_samples(out: Path, k: int = 20, seed: int = 0) -> list[dict[str, Any]]:
    """``k`` calls drawn at random from the annotated corpus, each with its method and the text around it
    (the value the call stands before marked ⟦...⟧)."""
    from ..annotate.validate import calls_with_offsets
    from ..corpus import iter_documents

    calls = []
    for d in iter_documents(out / "annotate" / "documents.jsonl"):
        for (q, c), m in zip(calls_with_offsets(d.segments), d.meta.get("call_methods", [])):
            calls.append((d, q, c, m))
    rng = random.Random(seed)
    picked = rng.sample(calls, min(k, len(calls)))
    return [{"document": d.id, "method": m, "entity": c.entity, "relation": c.relation, "value": c.value,
             "context": d.text[max(0, q - 120):q] + "⟦" + d.text[q:q + len(c.value)] + "⟧"
                        + d.text[q + len(c.value):q + len(c.value) + 40]} for d, q, c, m in picked]


def _figures(out: Path, report: dict) -> dict[str, str]:
    plt = plt_module()
    figs: dict[str, str] = {}
    (out / "figures").mkdir(exist_ok=True)
    by_method = report["corpus"]["calls_by_method"]
    if by_method:
        fig, ax = plt.subplots(figsize=(6, 3))
        names = list(by_method)
        ax.barh([METHOD_NAMES.get(n, n) for n in names], [by_method[n] for n in names], color="#4c72b0")
        ax.set_xlabel("lookup calls in the corpus")
        ax.set_title(f"Calls per annotation method ({report['corpus']['lookup_calls']} in all)")
        fig.tight_layout()
        fig.savefig(out / "figures" / "calls.png", dpi=120)
        plt.close(fig)
        figs["calls"] = "figures/calls.png"
    rows = report["cloze"]["table"]
    splits = sorted({s for r in rows for s in r if s != "model"}, key=lambda s: (s != "train", s))
    if rows and splits:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        width = 0.8 / len(rows)
        for k, r in enumerate(rows):
            vals = [(r.get(s) or {}).get("precision") or 0.0 for s in splits]
            cis = [(r.get(s) or {}).get("precision_ci95") or (v, v) for s, v in zip(splits, vals)]
            ax.bar([i + k * width for i in range(len(splits))], vals, width, label=MODEL_NAMES.get(r["model"], r["model"]),
                   yerr=[[max(0.0, v - lo) for v, (lo, _) in zip(vals, cis)], [max(0.0, hi - v) for v, (_, hi) in
                                                                               zip(vals, cis)]],
                   error_kw={"elinewidth": 0.8, "capsize": 2, "ecolor": "#333333"})
        ax.set_xticks([i + width * (len(rows) - 1) / 2 for i in range(len(splits))])
        ax.set_xticklabels([f"{SPLIT_NAMES.get(s, s)} "
                            f"(n={(rows[0].get(s) or {}).get('n', 0)})" for s in splits])
        ax.set_ylabel("cloze precision")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
        ax.set_title("Real facts: the value in the first five content words (95% intervals)")
        fig.tight_layout()
        fig.savefig(out / "figures" / "cloze.png", dpi=120)
        plt.close(fig)
        figs["cloze"] = "figures/cloze.png"
    runs = {m.upper(): out / f"train-{m}" for m in report["models"]}
    if plot_training_curves(runs, out / "figures" / "training.png"):
        figs["training"] = "figures/training.png"
    if plot_protocols(report.get("protocols"), out / "figures" / "editing.png"):
        figs["protocols"] = "figures/editing.png"
    return figs


def write_pipeline_report(recipe: Recipe, out: Path, corpus: dict, annotation: dict, kb: dict, models: dict,
                          evaluation: dict, timings: dict, protocols: dict | None = None) -> dict:
    """Assemble ``report.json`` and ``report.md`` (with figures) in ``out``; return the report."""
    stage_seconds = {"corpus": corpus.get("seconds"), "annotate": annotation.get("seconds"),
                     "kb": kb.get("seconds"), "evaluate": evaluation.get("seconds"),
                     "protocols": (protocols or {}).get("seconds"),
                     **{f"train_{m}": s.get("seconds") for m, s in models.items()}}
    report = {
        "recipe": recipe.to_dict(),
        "corpus": {k: annotation.get(k) for k in ("documents", "documents_with_calls", "characters", "lookup_calls",
                                                  "text_unchanged", "calls_by_method", "splits")},
        "annotation": {"infobox": corpus.get("wikipedia"), "llm": annotation.get("llm")},
        "kb": kb,
        "models": models,
        "cloze": {"table": _cloze_rows(evaluation.get("table", {})), "facts": evaluation.get("cloze", {}),
                  "metric": "precision: the value among the first five content words of the greedy continuation "
                            "(LAMA T-REx rule); precision_at_1: the first content words are the value"},
        "perplexity": evaluation.get("perplexity"),
        "edits": evaluation.get("edits"),
        "protocols": {k: v for k, v in protocols.items() if k != "seconds"} if protocols else None,
        "call_samples": _call_samples(out, 20, recipe.seed),
        "timings_seconds": {**stage_seconds, **timings},
        "runs": _runs(out),
    }
    report["figures"] = _figures(out, report)
    write_json(out / "report.json", report)
    (out / "report.md").write_text(_markdown(report, out), encoding="utf-8")
    return report


def _runs(out: Path) -> list[dict]:
    """Each run of the folder: when, on which device, the stages done before it, where it stopped."""
    path = out / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _markdown(r: dict, out: Path) -> str:
    c, rec = r["corpus"], r["recipe"]
    lines = [f"# lmlm pipeline `{rec['name']}`", "", rec.get("description", ""), "",
             "## Corpus and annotation", "",
             f"{c['documents']} documents ({fmt_value(c.get('characters'))} characters; splits {c.get('splits')}), "
             f"**{c['lookup_calls']} lookup calls**, text unchanged in {fmt_value(c['text_unchanged'])} of the documents.",
             "", "| method | calls |", "|---|---|"]
    lines += [f"| {METHOD_NAMES.get(m, m)} | {n} |" for m, n in (c.get("calls_by_method") or {}).items()]
    llm = r["annotation"].get("llm") or {}
    if llm:
        seed, corr = llm.get("seed") or {}, llm.get("correct") or {}
        lines += ["", f"LLM path: {llm.get('seed_passages')} seed passages annotated by the LLM "
                  f"({seed.get('kept')} of {seed.get('calls')} calls passed validation, "
                  f"rejected: {seed.get('rejected_by_reason')}); the corrector dropped {corr.get('dropped')} of "
                  f"{corr.get('calls')}; {_run_sentence(llm)}"]
        vet = llm.get("vetting") or {}
        if vet:
            lines += ["", f"The LLM's calls against the reference facts (`annotate.llm.keep = {vet['keep']}`):", "",
                      "| method | calls | agree | conflict | unknown entity | unknown relation | kept |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {METHOD_NAMES.get(m, m)} | {v['calls']} | {v['agrees']} | {v['conflicts']} | "
                      f"{v['unknown_entity']} | {v['unknown_relation']} | {v['kept']} |"
                      for m, v in vet.items() if isinstance(v, dict)]
    if r.get("figures", {}).get("calls"):
        lines += ["", f"![calls per method]({r['figures']['calls']})"]
    lines += ["", f"Knowledge base: {r['kb'].get('triples', r['kb'].get('active_triples', '–'))} triples.", "",
              "## Cloze precision on real facts", "", r["cloze"]["metric"] + ".", ""]
    table = r["cloze"]["table"]
    splits = sorted({s for row in table for s in row if s != "model"}, key=lambda s: (s != "train", s))
    if not table:
        lines += ["No cloze prompts: they are made from the calls of a reference method (`infobox`, or `given`: the "
                  "corpus's own calls) whose value the text states where the call stands, and this run has none. "
                  "The LLM's calls are not taken as gold."]
    if table:
        lines += [("Each precision with its 95% interval (Wilson's): on a split of a few dozen prompts, rates that "
                   "differ by less than the intervals' width are not told apart."), "",
                  "| model | " + " | ".join(f"{s}: precision | {s}: P@1 | {s}: n" for s in splits) + " |",
                  "|---|" + "---|---|---|" * len(splits)]
        for row in table:
            cells = []
            for s in splits:
                m = row.get(s) or {}
                ci = m.get("precision_ci95")
                cells += [fmt_value(m.get("precision")) + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""),
                          fmt_value(m.get("precision_at_1")), str(m.get("n", "–"))]
            lines.append(f"| {MODEL_NAMES.get(row['model'], row['model'])} | " + " | ".join(cells) + " |")
    calls = [(row, s) for row in table for s in splits if (row.get(s) or {}).get("names_subject") is not None
             and row["model"].startswith("lmlm") and row["model"] != "lmlm_no_kb"]
    if calls:
        lines += ["", "Share of prompts whose first lookup names the prompt's entity: " + "; ".join(
            f"{MODEL_NAMES.get(row['model'], row['model'])}, {s}: {fmt_value(row[s]['names_subject'])}" for row, s in calls)
            + "."]
    if r.get("figures", {}).get("cloze"):
        lines += ["", f"![cloze precision]({r['figures']['cloze']})"]
    ppl = r.get("perplexity") or {}
    if ppl:
        lines += ["", "## Plain held-out text", "", "Perplexity on held-out chunks without calls (the language a "
                  "continued model keeps):", "", "| model | perplexity | tokens |", "|---|---|---|"]
        lines += [f"| {MODEL_NAMES.get(m, m)} | {fmt_value(v.get('perplexity'))} | {v.get('org_tokens')} |"
                  for m, v in ppl.items()]
    lines += _edits_section(r.get("edits") or {})
    lines += _protocols_section(r)
    lines += ["", "## Models", "", "| model | steps | tokens | final loss | held-out loss | seconds |",
              "|---|---|---|---|---|---|"]
    for m, s in r["models"].items():
        held = (s.get("eval") or {}).get("loss") if isinstance(s.get("eval"), dict) else None
        lines.append(f"| {m} | {s.get('steps')} | {s.get('tokens')} | {fmt_value(s.get('final_loss'))} | {fmt_value(held)} | "
                     f"{fmt_value(s.get('seconds'), 0)} |")
    if r.get("figures", {}).get("training"):
        lines += ["", f"![training]({r['figures']['training']})"]
    lines += ["", "## 20 calls drawn at random", ""]
    lines += [f"- `{s['method']}` {s['entity']} · {s['relation']} → {s['value']}: …{s['context']}…".replace("\n", " ")
              for s in r["call_samples"]]
    samples = _generation_samples(out)
    if samples:
        lines += ["", "## Sample cloze generations (LMLM)", ""]
        lines += [f"- gold *{s['gold']}*: {render_generation(s['text'])}" for s in samples]
    lines += ["", "## Time", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {fmt_value(v, 0)} |" for k, v in r["timings_seconds"].items() if v is not None]
    if len(r["runs"]) > 1:
        lines += ["", "Run in parts: " + "; ".join(
            f"{x['started']} on {x['ran_on']}" + (f" until {x['until']}" if x.get("until") else "")
            for x in r["runs"]) + "."]
    return "\n".join(lines) + "\n"


def _protocols_section(r: dict) -> list[str]:
    """The report's lines on editing and forgetting by the fields' protocols (none without them)."""
    from ..evaluate.protocols import protocol_lines

    lines = protocol_lines(r.get("protocols"))
    if lines and r.get("figures", {}).get("protocols"):
        lines += [f"![sequential edits]({r['figures']['protocols']})"]
    return [""] + lines if lines else []


def _edits_section(e: dict) -> list[str]:
    """The report's lines on the edits of real facts (none without edits)."""
    if not e:
        return []
    lines = ["", "## Editing real facts in the KB", "",
             f"{e.get('candidates', e['n'])} facts given another value of their relation in a copy of the KB. "
             f"Of the {e['n']} the LMLM stated before the edit (the first ones), it states the new value "
             f"{fmt_value(e['new_value_after'])} of the time after it (the old one {fmt_value(e['old_value_after'])}). "
             f"Over all of them: the old value stated before {fmt_value(e['old_value_before'])}, the new one after "
             f"{fmt_value(e.get('new_value_after_all'))}."]
    by_kb = e.get("scored_by_kb") or {}
    if len(by_kb) > 1:  # the corpus's facts first, then those of the KB of entities no text names
        lines[-1] += " The scored edits by KB: " + ", ".join(f"`{k}` {v}" for k, v in by_kb.items()) + "."
    return lines


def _run_sentence(llm: dict) -> str:
    """What became of the distilled annotator: its held-out check and whether it ran."""
    check = (llm.get("distill") or {}).get("check")
    said = (f"on held-out annotated passages it scored call-level F1 {fmt_value(check['f1'])} ({check['predicted']} calls "
            f"for {check['gold']}, {check['correct']} right)") if check else ""
    run = llm.get("run") or {}
    if not llm.get("distill"):
        return "no annotator was distilled."
    if llm["distill"].get("skipped"):
        return f"no annotator was distilled: {llm['distill']['skipped']}."
    if run.get("skipped"):
        return f"the distilled annotator did not run: {said or run['skipped']}, below `min_f1`."
    return f"the distilled annotator ran on {llm.get('run_passages')} passages" + (f" ({said})." if said else ".")


def _generation_samples(out: Path, k: int = 6) -> list[dict]:
    for split in ("train", "heldout"):
        path = out / "eval" / f"cloze-lmlm-{split}.json"
        if path.exists():
            return [{"gold": rec["gold"], "text": rec["prompt"] + rec["text"]}
                    for rec in json.loads(path.read_text())["records"][:k]]
    return []
