"""Real facts as cloze prompts, the models scored on them per split, and edits of real facts in the KB.

Cloze prompts are written in LAMA T-REx's JSON-lines format (``sub_label``, ``obj_label``,
``predicate_id``, ``uuid``, ``masked_sentences``) for the reference facts the text states: the
infobox facts (or the given corpus's calls) at the place an article mentions them in the KB's own
words (a value the text writes otherwise, a date in another order, is left out: no single gold
string would be fair to both a model that copies the KB and one that copies the text). The masked
sentence is the sentence cut right after the masked value, so the T-REx reader's left-to-right filter
keeps it; unless the sentence opens with the fact's entity, the entity is put in front on a line of
its own, as the training chunks and windows are headed (``Abraham Lincoln\nHe married [MASK]``).
One file per split: ``train`` (facts of articles
the models read) and ``heldout`` (facts of articles no model read; the KB holds them all).

The models are then scored with :func:`lmlm.evaluate.trex.trex_eval` (greedy decoding; the LMLM with
a lookup forced at the mask). Finally ``edits`` facts are given another value of the same relation in
a copy of the KB and the LMLM is asked again: how often does it state the new value?
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..corpus import Document
from ..device import default_device

__all__ = ["ClozeFact", "open_base", "cloze_facts", "write_trex", "choose_edits", "evaluate_models", "evaluate_edits",
           "plain_perplexity", "MODELS"]

REFERENCE_METHODS = ("infobox", "given")
_BOUNDARY = re.compile(r"[.!?]\s+(?=[\"'(\[]?[A-Z0-9])|\n")


@dataclass(frozen=True)
class ClozeFact:
    entity: str
    relation: str
    value: str
    prompt: str
    split: str
    doc: str
    at: int

    def trex(self) -> dict[str, Any]:
        """The LAMA T-REx record of this fact."""
        return {"uuid": f"{self.doc}@{self.at}", "sub_label": self.entity, "obj_label": self.value,
                "predicate_id": self.relation, "masked_sentences": [f"{self.prompt} [MASK] ."],
                "split": self.split, "source": self.doc}


def _prompt(text: str, at: int, entity: str) -> str | None:
    """The sentence around offset ``at`` cut there, with the entity in front when the sentence lacks it."""
    start = 0
    for m in _BOUNDARY.finditer(text, 0, at):
        start = m.end()
    head = " ".join(text[start:at].split())
    if len(head.split()) < 2:
        head = " ".join(text[max(0, at - 160):at].split()[-12:])  # a short sentence: the words before it
    if not head:
        return None
    # headed by the entity as training chunks and windows are, unless the sentence opens with it: a prompt
    # whose subject stands only mid-sentence ("..., is a satirical essay written by") names no one first
    return head if head.casefold().startswith(entity.casefold()) else f"{entity}\n{head}"


def cloze_facts(documents: list[Document], per_split: int = 0, seed: int = 0) -> dict[str, list[ClozeFact]]:
    """The reference facts stated in ``documents``, one per (entity, relation), grouped by split.

    Args:
        documents: merged documents whose ``meta["call_methods"]`` names each call's method.
        per_split: keep a seeded sample of at most this many per split (0: all).
    """
    from ..annotate.validate import calls_with_offsets
    from ..evaluate.cloze import content_words

    out: dict[str, list[ClozeFact]] = {}
    seen: set[tuple[str, str, str]] = set()
    for d in documents:
        methods = d.meta.get("call_methods") or ["given"] * d.num_calls
        for (q, call), method in zip(calls_with_offsets(d.segments), methods):
            split = d.split or "train"
            key = (split, call.entity.casefold(), call.relation.casefold())
            if method not in REFERENCE_METHODS or key in seen or not content_words(call.value):
                continue
            if d.text[q:q + len(call.value)].casefold() != call.value.casefold():
                continue  # the text words it otherwise ("3 April 1885" for "April 3, 1885"): no fair gold
            prompt = _prompt(d.text, q, call.entity)
            if prompt:
                seen.add(key)
                out.setdefault(split, []).append(ClozeFact(call.entity, call.relation, call.value, prompt, split,
                                                           d.id, q))
    if per_split:
        rng = random.Random(seed)
        out = {s: sorted(rng.sample(f, per_split), key=f.index) if len(f) > per_split else f for s, f in out.items()}
    return out


def write_trex(facts: list[ClozeFact], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(f.trex(), ensure_ascii=False) + "\n" for f in facts), encoding="utf-8")
    return path


def choose_edits(facts: list[ClozeFact], n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` facts and a new value for each: another value of the same relation (seeded choice)."""
    values: dict[str, list[str]] = {}
    for f in facts:
        values.setdefault(f.relation, [])
        if f.value.casefold() not in {v.casefold() for v in values[f.relation]}:  # "Greek" and "greek": one value
            values[f.relation].append(f.value)
    rng = random.Random(seed)
    pool = [f for f in facts if len(values[f.relation]) > 1]
    rng.shuffle(pool)
    out, keys = [], set()
    for f in pool:
        if (f.entity, f.relation) in keys:
            continue
        keys.add((f.entity, f.relation))
        new = rng.choice([v for v in values[f.relation] if v.casefold() != f.value.casefold()])
        out.append({"entity": f.entity, "relation": f.relation, "old_value": f.value, "new_value": new,
                    "prompt": f.prompt, "split": f.split})
        if len(out) == n:
            break
    return out


# -- evaluation -------------------------------------------------------------------------------------

def open_base(base: str, device: str):
    """The untouched pretrained model with rows for the four lookup tokens (never written: its own outputs)."""
    from ..pretrained import start_pretrained

    m, tok, _ = start_pretrained(base)
    return m.to(device).eval(), tok


def _generators(models: dict[str, Path], kb_path: Path, base: str | None, constrained: bool, device: str,
                free: bool = False, decoding: dict | None = None):
    """``{name: (generator, force_lookup)}`` for every model the table compares."""
    from ..checkpoint import load_checkpoint
    from ..generate import LookupGenerator
    from ..kb import KnowledgeBase

    gens: dict[str, tuple[Any, bool]] = {}
    if "lmlm" in models:
        m, tok, _ = load_checkpoint(models["lmlm"], device=device)
        kb = KnowledgeBase.open(kb_path)
        decoding = decoding or {}
        gens["lmlm"] = (LookupGenerator(m, tok, kb, on_miss="skip", **decoding), True)
        if free:
            gens["lmlm_free"] = (LookupGenerator(m, tok, kb, on_miss="skip", **decoding), False)
        if constrained:
            # the entity kept on the text's names (name_bias), the relation on that entity's keys (the prefix tree)
            gens["lmlm_constrained"] = (LookupGenerator(m, tok, kb, on_miss="skip", constrained=True, **decoding), True)
        gens["lmlm_no_kb"] = (LookupGenerator(m, tok, None, use_db=False), False)
    if "standard" in models:
        m, tok, _ = load_checkpoint(models["standard"], device=device)
        gens["standard"] = (LookupGenerator(m, tok, None, use_db=False), False)
    if base:
        m, tok = open_base(base, device)
        gens["base"] = (LookupGenerator(m, tok, None, use_db=False), False)
    return gens


MODELS = ("lmlm", "lmlm_free", "lmlm_constrained", "lmlm_no_kb", "standard", "base")


def evaluate_models(folder: Path, cloze_files: dict[str, Path], models: dict[str, Path], kb_path: Path,
                    base: str | None, constrained: bool, device: str, max_new_tokens: int, batch_size: int,
                    log=print, free: bool = False, decoding: dict | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Score every model on every split's cloze file; ``{model: {split: metrics}}`` (results JSON per pair).

    ``free``: the LMLM also decodes without a lookup forced at the mask (``lmlm_free``); ``decoding``: the
    LMLM's ``name_bias`` and ``copy_bias`` (:class:`lmlm.generate.LookupGenerator`), the constrained row's too:
    its prefix tree keeps a query on the KB's keys, the name bias its entity on the names the text gives)."""
    from ..evaluate.base import write_results
    from ..evaluate.trex import TREX, read_trex, trex_eval

    folder.mkdir(parents=True, exist_ok=True)
    device = default_device(device)
    table: dict[str, dict[str, dict[str, float]]] = {}
    gens = None
    names = [n for n in MODELS
             if (n.startswith("lmlm") and "lmlm" in models and (n != "lmlm_constrained" or constrained)
                 and (n != "lmlm_free" or free))
             or (n == "standard" and "standard" in models) or (n == "base" and base)]
    for name in names:
        for split, path in cloze_files.items():
            out = folder / f"cloze-{name}-{split}.json"
            if not out.exists():
                gens = gens or _generators(models, kb_path, base, constrained, device, free, decoding)
                gen, force = gens[name]
                items = [replace(it, prompt=fit_prompt(it.prompt, gen, max_new_tokens)) for it in read_trex(path)]
                log(f"cloze: {name} on {len(items)} {split} facts")
                records: list = []
                metrics = trex_eval(gen, items, force_lookup=force, max_new_tokens=max_new_tokens,
                                    batch_size=batch_size, by_relation=False, records=records)
                write_results(out, TREX, metrics, records, {"model": name, "split": split, "data": str(path)})
            table.setdefault(name, {})[split] = json.loads(out.read_text())["metrics"]
    if gens:
        _close(gens)
    return table


def plain_perplexity(texts: list[str], models: dict[str, Path], base: str | None, device: str,
                     batch_size: int = 8) -> dict[str, dict[str, float]]:
    """Each model's perplexity on plain text (no lookup calls), the untouched ``base`` beside them: does
    continued training as an LMLM keep the language the pretrained model had?"""
    from ..checkpoint import load_checkpoint
    from ..evaluate.perplexity import standard_perplexity

    device = default_device(device)
    out = {}
    for name, path in models.items():
        m, tok, _ = load_checkpoint(path, device=device)
        out[name] = standard_perplexity(m.eval(), tok, texts, batch_size)
    if base:
        m, tok = open_base(base, device)
        out["base"] = standard_perplexity(m, tok, texts, batch_size)
    return out


def _context(model) -> int:
    cfg = model.config
    return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 1 << 30


def fit_prompt(prompt: str, gen, max_new_tokens: int) -> str:
    """``prompt`` cut from the left, at a word, until it and the continuation fit the model's context."""
    limit = _context(gen.model) - max_new_tokens - 4  # the document separator and a forced call start
    words = prompt.split(" ")
    while len(words) > 1 and len(gen.tok.encode_text(" ".join(words))) > limit:
        words = words[max(1, len(words) // 8):]
    return " ".join(words)


def _close(gens) -> None:
    for gen, _ in gens.values():
        if getattr(gen, "kb", None) is not None:
            gen.kb.close()


def evaluate_edits(folder: Path, pools: list[tuple[list[dict[str, str]], Path]], lmlm: Path, device: str,
                   max_new_tokens: int, batch_size: int, decoding: dict | None = None,
                   constrained: bool = False, n: int | None = None) -> dict[str, Any]:
    """Change the facts of each pool in a copy of its KB and ask the LMLM again: how often it states the new value.

    ``pools``: ``(edits, kb_path)`` pairs, in the order they are drawn from (the corpus's own facts first,
    then facts of a KB of their own). The editing field's protocol: an edit is scored on a fact the model
    stated before it (otherwise it measures the model's retrieval, which the cloze table does, and not the
    edit). So every candidate is asked first; the first ``n`` whose answer states the old value are the
    scored edits (``n``, ``new_value_after``, ``old_value_after``; a later pool is asked only while fewer
    than ``n`` are found), and every candidate asked is edited and scored as well (``candidates``,
    ``old_value_before``: the share stated before, ``new_value_after_all``). ``constrained``: queries kept
    on the KB's keys, as the report's constrained row.
    """
    from ..checkpoint import load_checkpoint

    model = load_checkpoint(lmlm, device=default_device(device))
    records, versions = [], []
    for i, (edits, kb_path) in enumerate(pools):
        if n is not None and sum(r["old_before"] for r in records) >= n:
            break
        got, version = _edit_pool(folder / ("kb-edited" if i == 0 else f"kb-edited-{i}"), edits, model, kb_path,
                                  max_new_tokens, batch_size, decoding, constrained)
        records += [{**r, "kb": kb_path.name} for r in got]
        versions.append(version)
    known = [r for r in records if r["old_before"]][:len(records) if n is None else n]
    for r in known:
        r["scored"] = True

    def rate(rs: list[dict], k: str) -> float:
        return sum(r[k] for r in rs) / len(rs) if rs else float("nan")

    return {"n": len(known), "new_value_after": rate(known, "new_after"), "old_value_after": rate(known, "old_after"),
            "candidates": len(records), "old_value_before": rate(records, "old_before"),
            "new_value_after_all": rate(records, "new_after"), "kb_version": versions[0] if versions else None,
            "kb_versions": versions, "scored_by_kb": {k: sum(r["kb"] == k for r in known) for k in
                                                      dict.fromkeys(r["kb"] for r in records)}, "records": records}


def _edit_pool(edited: Path, edits: list[dict[str, str]], model: tuple, kb_path: Path, max_new_tokens: int,
               batch_size: int, decoding: dict | None, constrained: bool) -> tuple[list[dict], int]:
    """``edits`` made in a copy of ``kb_path`` at ``edited``, each prompt asked before and after: the records
    and the edited KB's version."""
    from ..evaluate.base import outputs_of
    from ..evaluate.cloze import match_first_content_words
    from ..generate import LookupGenerator
    from ..kb import KnowledgeBase

    if edited.exists():
        shutil.rmtree(edited)
    shutil.copytree(kb_path, edited)
    m, tok, _ = model
    kb = KnowledgeBase.open(edited)
    gen = LookupGenerator(m, tok, kb, on_miss="skip", constrained=constrained, **(decoding or {}))
    prompts = [fit_prompt(e["prompt"], gen, max_new_tokens) for e in edits]

    def ask() -> list[str]:
        results = gen.generate(prompts, max_new_tokens=max_new_tokens, batch_size=batch_size, force_lookup=True)
        return outputs_of(gen, results), results

    before, _ = ask()
    for e in edits:
        kb.edit(e["entity"], e["relation"], e["new_value"], who="lmlm pipeline", why="edit of a real fact")
    after, results = ask()
    records = []
    for e, b, a, r in zip(edits, before, after, results):
        records.append({**e, "before": b, "after": a,
                        "old_before": match_first_content_words(b, e["old_value"]),
                        "new_after": match_first_content_words(a, e["new_value"]),
                        "old_after": match_first_content_words(a, e["old_value"]),
                        "lookups": [t.to_dict() if hasattr(t, "to_dict") else dict(vars(t)) for t in r.trace]})
    version = kb.version
    kb.close()
    return records, version
