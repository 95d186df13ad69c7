"""The editing and unlearning fields' protocols as one section of a run's report.

An LMLM's promise beyond the rest of the field is that a fact is a row: editing it is a KB update and
forgetting it a delete. :func:`run_protocols` measures both as those fields do, on a trained LMLM and its
KB, beside the field's own method on the same run's Standard model and the published numbers:

* **editing** (:mod:`lmlm.evaluate.editing`): CounterFact rewrites written from the KB's facts (a world's
  phrasings, or "The <relation> of <entity> is"), applied one after another (each count from the same KB),
  efficacy, paraphrase, neighbourhood and fluency with their n and the edits' seconds; optionally FT-L
  (:class:`lmlm.evaluate.weight_editing.FineTuneL`) on the Standard model's weights at its own counts;
* **forgetting** (:mod:`lmlm.evaluate.forgetting`): the audit's FULL, DEL-ON and DEL-OFF, retrieval-mediated
  residue per adversarial kind, and parametric leakage beside the Standard model's guess rate on facts of
  entities no model read.

Every measurement runs on a copy of the KB; the results files (``editing-lmlm.json``, ``editing-ft-l.json``,
``forgetting.json``, the format of ``lmlm eval editing`` and ``lmlm eval forgetting``) go to the section's
folder with the rewrites written (``counterfact.json``). :func:`protocol_lines` renders the section for a
report (:func:`lmlm.report.plot_protocols` its figure). Exercised by ``lmlm quickstart`` (``protocol_*`` settings) and ``lmlm pipeline`` (its ``[protocols]``
table).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from .forgetting import Fact

__all__ = ["PUBLISHED", "run_protocols", "protocol_lines", "EDITING_COLUMNS"]

# the published numbers the section shows as context: other models, other data, labelled so
PUBLISHED = {
    "editing": {
        "about": "another model: GPT2-XL after 2,000 sequential CounterFact edits, as AlphaEdit (Fang et al., 2025) "
                 "reports them; efficacy / generalization (paraphrase) / specificity (neighbourhood) scores, %",
        "rows": [{"method": "MEMIT", "efficacy": 94.7, "generalization": 85.8, "specificity": 60.5},
                 {"method": "AlphaEdit", "efficacy": 99.5, "generalization": 94.0, "specificity": 66.4}]},
    "forgetting": {
        "about": "another model: the audit of LMLM forgetting (Raeesi and Roed, 2026), retrieval-mediated residue "
                 "from the released database to adversarial queries",
        "residue_low": 0.007, "residue_high": 0.136},
}

# the editing table's columns: (key in a count's metrics, its label)
EDITING_COLUMNS = (("efficacy_score", "efficacy score"), ("efficacy_accuracy", "efficacy accuracy"),
                   ("unedited_precision", "unedited precision"), ("paraphrase_accuracy", "paraphrase accuracy"),
                   ("neighborhood_unchanged", "neighbourhood unchanged"), ("fluency_change", "fluency change"),
                   ("edit_seconds", "edit seconds"))


def _count_rows(metrics: dict, counts: Sequence[int]) -> list[dict]:
    """One row per count: each column with its n, from ``run_editing``'s ``editing_<N>_<metric>``."""
    rows = []
    for n in counts:
        got = {k[len(f"editing_{n}_"):]: v for k, v in metrics.items() if k.startswith(f"editing_{n}_")}
        row = {"edits": n, "facts_edited": got.get("facts_edited"), "n_cases": got.get("n_cases")}
        for key, _ in EDITING_COLUMNS:
            row[key] = got.get(key)
            if f"n_{key}" in got:
                row[f"n_{key}"] = got[f"n_{key}"]
        row["n_fluency"] = metrics.get("editing_n_fluency")
        rows.append(row)
    return rows


def run_protocols(lmlm, kb_folder: str | Path, out: str | Path, *, facts: dict[tuple[str, str], str],
                  world=None, standard=None, start=None, forget: Sequence[Fact] = (), unseen: Sequence[Fact] = (),
                  edits: Sequence[int] = (1, 100, 1000), weight_edits: Sequence[int] = (), sample: int = 100,
                  fluency_n: int = 50, fluency_tokens: int = 60, decoding: dict | None = None,
                  max_new_tokens: int = 24, batch_size: int = 32, seed: int = 0, log=print) -> dict:
    """Measure KB edits and deletes of an LMLM by the fields' protocols; return the report section.

    Args:
        lmlm: ``(model, tokenizer)`` of the LMLM; ``kb_folder``: its KB as at training (only copies change).
        out: the section's folder (the rewrites and the results files).
        facts: ``(entity, relation) -> value`` the rewrites are written from (:func:`~lmlm.evaluate.editing.
            world_facts`, :func:`~lmlm.evaluate.editing.kb_facts`); ``world``: a biography world, whose
            phrasings the prompts take.
        standard: ``(model, tokenizer)`` of the Standard model: FT-L's weights (``weight_edits``) and the
            audit's reference guess rate on ``unseen``; ``start``: ``(model, tokenizer)`` of the pretrained
            model the LMLM was continued from, the audit's reference for what it knew before (``None``: none).
        forget: the facts the audit deletes (every fact of their entities goes, with the alias closure);
            ``unseen``: facts of entities no model read (empty ``forget``: no audit).
        edits: sequential KB edit counts (empty: no editing); ``weight_edits``: FT-L's counts (empty: none).
        sample, fluency_n, fluency_tokens: scored facts per count, fluency texts and their length.
        decoding: the LMLM's ``name_bias`` and ``copy_bias``; ``batch_size``: rows per generation and
            scoring batch (the same outputs at any size, greedy rows; a small model on a CPU runs a larger
            batch in less time).
    """
    out, decoding = Path(out), dict(decoding or {})
    out.mkdir(parents=True, exist_ok=True)
    config = {"sample": sample, "fluency_n": fluency_n, "fluency_tokens": fluency_tokens, "seed": seed, **decoding}
    section: dict = {"published": PUBLISHED}
    weight_edits = list(weight_edits) if standard is not None else []
    if edits or weight_edits:
        section["editing"] = _editing(lmlm, standard, Path(kb_folder), out, facts, world, list(edits), weight_edits,
                                      config, batch_size, log)
    if forget:
        section["forgetting"] = _forgetting(lmlm, standard, start, Path(kb_folder), out, forget, unseen, config,
                                            max_new_tokens, batch_size, log)
    return section


def _editing(lmlm, standard, kb_folder: Path, out: Path, facts, world, edits: list[int], weight_edits: list[int],
             config: dict, batch_size: int, log) -> dict:
    """The editing part of :func:`run_protocols`: the rewrites written, each method's counts run and scored."""
    from ..generate import LookupGenerator
    from .base import write_results
    from .editing import (
        EDITING,
        KBEditor,
        WeightEditor,
        counterfact_records,
        read_edit_set,
        run_editing,
        write_records,
    )

    try:
        rewrites = counterfact_records(facts, max(edits + weight_edits), world=world, seed=config["seed"])
    except ValueError as e:  # no relation with a second value to edit a fact to
        log(f"editing: not measured: {e}")
        return {"skipped": str(e), "facts": len(facts)}
    cases = read_edit_set(write_records(out / "counterfact.json", rewrites))
    decoding = {k: config[k] for k in ("name_bias", "copy_bias") if k in config}
    model, tok = lmlm
    runs = [("lmlm", KBEditor(kb_folder, lambda kb: LookupGenerator(model, tok, kb, **decoding), batch_size),
             edits)] if edits else []
    if weight_edits:
        from .weight_editing import FineTuneL

        sm, stok = standard
        plain = LookupGenerator(sm, stok, None, use_db=False)
        runs.append(("ft-l", WeightEditor(FineTuneL(sm, stok), plain, batch_size), weight_edits))
    editing: dict = {"rewrites": len(cases), "facts": len(facts)}
    for name, editor, counts in runs:
        records: list = []
        metrics = run_editing(editor, cases, counts, sample=config["sample"], fluency_n=config["fluency_n"],
                              fluency_tokens=config["fluency_tokens"], seed=config["seed"], log=log, records=records)
        write_results(out / f"editing-{name}.json", EDITING, metrics, records,
                      {**config, "method": name, "edits": counts, "data": str(out / "counterfact.json")})
        editing[name] = {"fluency_before": metrics.get("editing_fluency_before"), "rows": _count_rows(metrics, counts)}
    return editing


def _forgetting(lmlm, standard, start, kb_folder: Path, out: Path, forget, unseen, config: dict, max_new_tokens: int,
                batch_size: int, log) -> dict:
    """The audit part of :func:`run_protocols`, on a copy of the KB."""
    from .base import scratch_kb, write_results
    from .forgetting import FORGETTING, audit_forgetting

    work, tmp = scratch_kb(kb_folder, "lmlm-protocols-kb-")
    try:
        records: list = []
        decoding = {k: config[k] for k in ("name_bias", "copy_bias") if k in config}
        metrics = audit_forgetting(*lmlm, work, forget, unseen=unseen, standard=standard, start=start,
                                   decoding=decoding, max_new_tokens=max_new_tokens, batch_size=batch_size, records=records, log=log)
        work.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    by_kind = metrics.pop("forgetting_by_kind")
    write_results(out / "forgetting.json", FORGETTING, metrics, [{"by_kind": by_kind}, *records],
                  {**config, "by_kind": by_kind})
    return {**{k[len("forgetting_"):]: v for k, v in metrics.items()}, "by_kind": by_kind}


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def protocol_lines(section: dict | None, heading: str = "##") -> list[str]:
    """The section as Markdown: the editing table per method, the forgetting audit, the published context."""
    if not section or not ({"editing", "forgetting"} & set(section)):
        return []
    lines = [f"{heading} Editing and forgetting by the fields' protocols", ""]
    ed = section.get("editing")
    if ed and ed.get("skipped"):
        lines += [f"Editing not measured: {ed['skipped']}.", ""]
    elif ed:
        lines += [(f"CounterFact rewrites of the KB's facts ({ed['rewrites']:,} written from {ed['facts']:,} facts), "
                   "applied one after another, each count from the same start; an LMLM edits a copy of its KB and is "
                   "scored through its lookups (a call forced at the answer, the object scored after it), FT-L edits "
                   "the Standard model's weights. Each value with its n in brackets."), "",
                  "| method | edits | " + " | ".join(label for _, label in EDITING_COLUMNS) + " |",
                  "|---|---:|" + "---:|" * len(EDITING_COLUMNS)]
        for name in ("lmlm", "ft-l"):
            for row in (ed.get(name) or {}).get("rows", []):
                cells = []
                for key, _ in EDITING_COLUMNS:
                    v = row.get(key)
                    if key == "fluency_change":
                        cells.append("–" if v is None else f"{v:+.1%} ({row.get('n_fluency')})")
                    elif key == "edit_seconds":
                        cells.append(_fmt(v, 2))
                    else:
                        n = row.get(f"n_{key}")
                        cells.append(_fmt(v) + (f" ({n})" if n is not None else ""))
                label = "LMLM (KB edit)" if name == "lmlm" else "FT-L (weights, Standard model)"
                lines.append(f"| {label} | {row['edits']:,} | " + " | ".join(cells) + " |")
        pub = section["published"]["editing"]
        lines += ["", f"Context ({pub['about']}): " + "; ".join(
            f"{r['method']} {r['efficacy']} / {r['generalization']} / {r['specificity']}" for r in pub["rows"]) + ".", ""]
    fo = section.get("forgetting")
    if fo:
        std = fo.get("unseen_standard")
        lines += [f"Forgetting audit: {fo['n_facts']:,} facts of {fo['entities']:,} entities deleted with their alias "
                  f"closure ({fo['aliases']:,} aliases, {fo['facts_deleted']:,} KB facts), {fo['n_probes']:,} probes. "
                  f"FULL precision {_fmt(fo['full_precision'])}, DEL-ON {_fmt(fo['del_on_precision'])}; parametric "
                  f"leakage (DEL-OFF) {_fmt(fo['parametric_leakage'])} (n {fo['n_facts']:,})"
                  + (f" against the Standard model's guess rate {_fmt(std)} on {fo['n_unseen']:,} facts it never read"
                     if std is not None else "")
                  + (f"; the model it was continued from stated {_fmt(fo['start_knew'])} of the same facts before any "
                     f"LMLM training, and {_fmt(fo['learned_leakage'])} are stated with the database off that it did not "
                     "(leakage learned, not inherited)" if fo.get("start_knew") is not None else "") + ".", "",
                  "| kind | n | KB residue (entity-aware) | KB residue (single key) | generated residue |",
                  "|---|---:|---:|---:|---:|"]
        for kind, row in fo["by_kind"].items():
            lines.append(f"| {kind} | {row['n']:,} | {_fmt(row.get('kb_entity_residue'))} | "
                         f"{_fmt(row.get('kb_key_residue'))} | {_fmt(row.get('generated_residue'))} |")
        pub = section["published"]["forgetting"]
        lines += ["", f"Context ({pub['about']}): {pub['residue_low']:.1%} to {pub['residue_high']:.1%}.", ""]
    return lines
