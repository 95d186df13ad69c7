"""Forgetting audited as the unlearning field audits an LMLM: the model fixed, the database varied.

Three states of one model (after the audit of LMLM forgetting by Raeesi and Roed, 2026):

* ``full``: every fact in the KB, lookups on;
* ``del_on``: the forget set's entities deleted, each with its alias closure (every name an alias
  row links to it, and any entity of the KB under one of those names), lookups on;
* ``del_off``: lookups off, the model alone.

Two ways a deleted fact ``(entity, relation, value)`` can still come out:

* **parametric leakage**: the model states the value with the database off (``del_off``). An LMLM
  keeps entity facts out of its weights, so its rate should be no higher than what a model that never
  read the facts gets by guessing: the Standard model's rate on facts of entities it never saw
  (``--unseen``), the reference the audit asks for. An LMLM continued from a pretrained model also
  inherits what that model knew: ``--start`` asks the start model the same prompts, and
  ``learned_leakage`` counts only the facts DEL-OFF states that the start model did not;
* **retrieval-mediated residue**: the database still gives the value after the delete. Every deleted
  fact is asked again in adversarial forms, counted per kind: ``name`` (as written), ``alias`` (each
  other name the KB held), ``misspelling`` (a letter dropped, two swapped, lower case, an initial),
  ``transliteration`` (diacritics added or folded, a respelling such as c -> k), ``relation``
  (the relation paraphrased: "birthplace" for Birth City) and ``description`` (the entity described
  by one or two of its other facts instead of named). Each form is asked of the KB directly, under entity-aware
  matching and the paper's single-key match, and through generation (``del_on``): residue is an
  answer, or a generation, that states the deleted value.

``lmlm eval forgetting`` writes ``{"protocol", "metrics", "records"}``; :func:`world_sets` makes the
forget and unseen sets of a synthetic biography world (the quickstart's), and any other corpus gives
them as JSON lines of ``entity``, ``relation``, ``value`` and ``prompt`` (or LAMA T-REx records).
"""

from __future__ import annotations

import random
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from .base import Protocol
from .cloze import match_first_content_words

__all__ = ["FORGETTING", "KINDS", "Fact", "Probe", "read_facts", "world_sets", "alias_closure", "probes",
           "misspellings", "transliterations", "relation_paraphrases", "audit_forgetting", "sample_facts"]

FORGETTING = Protocol("forgetting", "forgetting_residue_kb", greater_is_better=False,
                      paper="Raeesi and Roed (2026), an audit of LMLM forgetting: FULL, DEL-ON, DEL-OFF")
KINDS = ("name", "alias", "misspelling", "transliteration", "relation", "description")

# paraphrases of the biography world's relations; other relations take the annotator's cue words
_PARAPHRASES = {
    "birth date": ("date of birth", "birthday"),
    "birth city": ("birthplace", "city of birth"),
    "university": ("alma mater", "college attended"),
    "major": ("field of study", "subject studied"),
    "employer": ("company", "workplace"),
    "employer city": ("work location", "city of work"),
}
_RESPELL = (("ph", "f"), ("ck", "k"), ("c", "k"), ("y", "i"), ("ie", "y"), ("w", "v"), ("v", "w"), ("ou", "u"),
            ("ee", "i"), ("s", "z"), ("k", "c"), ("i", "y"), ("f", "ph"))
_ACCENT = {"a": "á", "e": "é", "i": "í", "o": "ó", "u": "ú", "n": "ñ", "c": "ç"}


@dataclass(frozen=True)
class Fact:
    """One fact to forget (or, unseen, one a model never read): its prompt ends where the value goes."""

    entity: str
    relation: str
    value: str
    prompt: str


@dataclass(frozen=True)
class Probe:
    """One adversarial form of a deleted fact: what is asked of the KB and the prompt that asks the model."""

    kind: str
    entity: str  # the name (or description) the query writes
    relation: str
    prompt: str
    fact: Fact


def read_facts(path: str | Path) -> list[Fact]:
    """Facts from JSON lines: ``entity``, ``relation``, ``value``, ``prompt`` each, or LAMA T-REx records
    (``sub_label``, ``predicate_id``, ``obj_label`` and a masked sentence ending in ``[MASK]``)."""
    from .base import read_json_records
    from .trex import cloze_prompt, masked_sentences

    path = Path(path)
    out = []
    for n, r in enumerate(read_json_records(path), 1):
        if not isinstance(r, dict):
            raise ValueError(f"{path}:{n}: expected an object, got {type(r).__name__}")
        if "sub_label" in r:
            prompt = next((p for p in map(cloze_prompt, masked_sentences(r)) if p), None)
            if prompt is None:
                raise ValueError(f"{path}:{n}: a T-REx record without a sentence ending in [MASK]")
            r = {"entity": r["sub_label"], "relation": r.get("predicate_id", ""), "value": r.get("obj_label", ""),
                 "prompt": prompt}
        missing = [k for k in ("entity", "relation", "value", "prompt") if not str(r.get(k) or "").strip()]
        if missing:
            raise ValueError(f"{path}:{n}: missing {', '.join(missing)}")
        out.append(Fact(str(r["entity"]), str(r["relation"]), str(r["value"]), str(r["prompt"])))
    if not out:
        raise ValueError(f"{path}: no facts")
    return out


def world_sets(world, fraction: float = 0.05, seed: int = 0) -> tuple[list[Fact], list[Fact]]:
    """A biography world's forget set (every fact of ``world.forget_set(fraction, seed)``, the quickstart's)
    and its unseen facts (the held-out people, in no training text and no KB), with cloze prompts."""
    def facts(names):
        return [Fact(p, r, world.person(p).facts[r], world.cloze(p, r).prompt)
                for p in names for r in world.person(p).facts]
    return facts(world.forget_set(fraction, seed=seed)), facts([p.name for p in world.people_in("heldout")])


# -- adversarial forms -------------------------------------------------------------------------------------

def _fold(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


def misspellings(name: str) -> list[str]:
    """Other spellings a user types: the last word with two inner letters swapped and with one dropped,
    the name in lower case, and the first name as an initial."""
    words = name.split()
    out = []
    last = words[-1] if words else name
    if len(last) >= 4:
        i = len(last) // 2
        out.append(" ".join(words[:-1] + [last[:i] + last[i + 1] + last[i] + last[i + 2:]]))
        out.append(" ".join(words[:-1] + [last[:i] + last[i + 1:]]))
    out.append(name.lower())
    if len(words) >= 2 and words[0][:1].isalpha():
        out.append(" ".join([words[0][0] + "."] + words[1:]))
    return [s for s in dict.fromkeys(out) if s != name]


def transliterations(name: str) -> list[str]:
    """The name as another script's romanisation would write it: diacritics folded (or one added to a
    name without any), and a respelling of one sound (c -> k, ph -> f, y -> i ...)."""
    out = []
    folded = _fold(name)
    if folded != name:
        out.append(folded)
    else:
        for i, c in enumerate(name):
            if c.lower() in _ACCENT and i > 0 and name[i - 1].isalpha():
                accent = _ACCENT[c.lower()]
                out.append(name[:i] + (accent.upper() if c.isupper() else accent) + name[i + 1:])
                break
    words = name.split()
    for a, b in _RESPELL:
        for k in range(len(words) - 1, -1, -1):  # the last name first
            w = words[k]
            at = w.lower().find(a, 1)
            if at > 0:
                words2 = words[:k] + [w[:at] + b + w[at + len(a):]] + words[k + 1:]
                out.append(" ".join(words2))
                break
        else:
            continue
        break
    return [s for s in dict.fromkeys(out) if s != name]


def relation_paraphrases(relation: str) -> list[str]:
    """Other words for a relation: the biography world's own table, else the annotator's cue words."""
    from ..annotate.support import CUES

    key = " ".join(relation.lower().split())
    if key in _PARAPHRASES:
        return list(_PARAPHRASES[key])
    cues = [c for c in CUES.get(key, ()) if len(c) > 3 and c != key]
    return cues[:2] or [f"{key} of record"]


def probes(facts: Sequence[Fact], aliases: dict[str, list[str]], kinds: Sequence[str] = KINDS) -> list[Probe]:
    """Every adversarial form of every fact (see the module), in ``kinds`` only."""
    by_entity: dict[str, list[Fact]] = {}
    for f in facts:
        by_entity.setdefault(f.entity, []).append(f)
    out = []
    for f in facts:
        def named(name: str, kind: str) -> Probe:
            prompt = f.prompt.replace(f.entity, name) if f.entity in f.prompt else f"{name}\n{f.prompt}"
            return Probe(kind, name, f.relation, prompt, f)
        forms = {"name": [named(f.entity, "name")],
                 "alias": [named(a, "alias") for a in aliases.get(f.entity, []) if a != f.entity],
                 "misspelling": [named(s, "misspelling") for s in misspellings(f.entity)],
                 "transliteration": [named(s, "transliteration") for s in transliterations(f.entity)],
                 "relation": [Probe("relation", f.entity, p, f"The {p} of {f.entity} is", f)
                              for p in relation_paraphrases(f.relation)]}
        others = [o for o in by_entity[f.entity] if o.relation != f.relation][:2]
        if others:
            desc = " and ".join(f"whose {o.relation.lower()} is {o.value}" for o in others)
            forms["description"] = [Probe("description", f"the person {desc}", f.relation,
                                          f"The {f.relation.lower()} of the person {desc} is", f)]
        for kind in kinds:
            out += forms.get(kind, [])
    return out


# -- the audit -------------------------------------------------------------------------------------------

def alias_closure(kb, entity: str) -> list[str]:
    """``entity`` and every name an alias row links to it, transitively (aliases of the entity, entities an
    alias of it names, their aliases ...): the names deleting the entity must reach."""
    from ..kb.keys import normalize_text

    rows = kb.aliases()
    names = {normalize_text(entity): entity}
    grew = True
    while grew:
        grew = False
        for a in rows:
            if (a.entity_norm in names) != (a.alias_norm in names):
                names.setdefault(a.entity_norm, a.entity)
                names.setdefault(a.alias_norm, a.alias)
                grew = True
    return list(names.values())


def _stated(output: str, value: str) -> bool:
    return match_first_content_words(output, value)


def _ask_kb(kb, probes_: Sequence[Probe], matching: str) -> list:
    return kb.resolve_batch([(p.entity, p.relation) for p in probes_], contexts=[p.prompt for p in probes_],
                            matching=matching)


def _generate(gen, prompts: Sequence[str], force: bool, max_new_tokens: int, batch_size: int) -> list[str]:
    from .base import outputs_of

    results = gen.generate(list(prompts), max_new_tokens=max_new_tokens, batch_size=batch_size, force_lookup=force)
    return outputs_of(gen, results)


def _share(flags: Sequence[bool]) -> float | None:
    return round(sum(flags) / len(flags), 4) if flags else None


def audit_forgetting(model, tok, kb, forget: Sequence[Fact], *, unseen: Sequence[Fact] = (), standard=None,
                     start=None, decoding: dict | None = None, max_new_tokens: int = 24, batch_size: int = 32,
                     kinds: Sequence[str] = KINDS, records: list | None = None, log=print,
                     on_miss: str = "text") -> dict:
    """Run the audit on ``kb`` (changed in place: the forget set's entities are deleted with their alias
    closures). ``model``/``tok``: the LMLM; ``standard``: ``(model, tok)`` of the Standard model for the
    unseen-facts reference; ``start``: ``(model, tok)`` of the pretrained model the LMLM was continued from,
    asked the forget set's own prompts (what it stated before any LMLM training is leakage the LMLM
    inherited, not learned: ``forgetting_start_knew``, and ``forgetting_learned_leakage``, the facts
    DEL-OFF states that the start model did not); ``decoding``: the LMLM's ``name_bias`` and ``copy_bias``;
    ``on_miss``: what a lookup the KB does not answer gets (``"text"``: "unknown", as ``lmlm generate``; ``"skip"``: nothing,
    and the model goes on by itself, which shows what its weights hold at the call). Returns the metrics
    (``forgetting_*``); ``records`` gets one row per probe and state."""
    from ..generate import LookupGenerator
    from ..kb.keys import normalize_text

    decoding = decoding or {}
    aliases = {}
    for e in dict.fromkeys(f.entity for f in forget):
        aliases[e] = [a for a in alias_closure(kb, e) if normalize_text(a) != normalize_text(e)]
    ps = probes(forget, aliases, kinds)
    on = LookupGenerator(model, tok, kb, on_miss=on_miss, **decoding)
    off = LookupGenerator(model, tok, None, use_db=False)
    base = [p for p in ps if p.kind == "name"]
    log(f"forgetting: {len(forget)} facts of {len(aliases)} entities, {len(ps)} probes ({', '.join(kinds)})")
    full = _generate(on, [p.prompt for p in base], True, max_new_tokens, batch_size)
    before_kb = _ask_kb(kb, base, "entity")

    deleted = 0
    for e, others in aliases.items():
        for name in [e, *others]:
            deleted += kb.delete(entity=name, who="lmlm eval forgetting", why="forget request: the entity and its aliases")
    log(f"forgetting: {deleted} facts deleted (KB v{kb.version})")

    kb_hits = {m: _ask_kb(kb, ps, m) for m in ("entity", "key")}
    del_on = _generate(on, [p.prompt for p in ps], True, max_new_tokens, batch_size)
    del_off = _generate(off, [p.prompt for p in base], False, max_new_tokens, batch_size)
    states = {"full": full, "del_on": del_on, "del_off": del_off}
    metrics = _metrics(ps, base, kb_hits, states, before_kb, kinds)
    metrics.update(forgetting_entities=len(aliases), forgetting_aliases=sum(len(a) for a in aliases.values()),
                   forgetting_facts_deleted=deleted, forgetting_kb_version=kb.version)
    if unseen:
        prompts = [f.prompt for f in unseen]
        metrics["forgetting_unseen_lmlm_no_db"] = _share(
            [_stated(o, f.value) for o, f in zip(_generate(off, prompts, False, max_new_tokens, batch_size), unseen)])
        if standard is not None:
            std = LookupGenerator(standard[0], standard[1], None, use_db=False)
            metrics["forgetting_unseen_standard"] = _share(
                [_stated(o, f.value) for o, f in zip(_generate(std, prompts, False, max_new_tokens, batch_size), unseen)])
        metrics["forgetting_n_unseen"] = len(unseen)
    if start is not None:
        first = LookupGenerator(start[0], start[1], None, use_db=False)
        states["start"] = _generate(first, [p.prompt for p in base], False, max_new_tokens, batch_size)
        knew = [_stated(o, p.fact.value) for o, p in zip(states["start"], base)]
        leaked = [_stated(o, p.fact.value) for o, p in zip(del_off, base)]
        metrics.update(forgetting_start_knew=_share(knew),
                       forgetting_learned_leakage=_share([lk and not k for lk, k in zip(leaked, knew)]))
    if records is not None:
        records += _records(ps, base, kb_hits, states)
    return metrics


def _residue(hit, fact: Fact) -> bool:
    """Whether a KB answer gives the deleted fact's value (whoever's row it comes from)."""
    from ..kb.keys import normalize_text

    return bool(hit) and normalize_text(hit.value) == normalize_text(fact.value)


def _metrics(ps: list[Probe], base: list[Probe], kb_hits: dict, states: dict, before_kb: list, kinds) -> dict:
    full, del_on, del_off = states["full"], states["del_on"], states["del_off"]
    per_kind: dict = {}
    for kind in kinds:
        idx = [i for i, p in enumerate(ps) if p.kind == kind]
        if not idx:
            continue
        row: dict = {"n": len(idx)}
        for m, hits in kb_hits.items():
            row[f"kb_{m}_answered"] = _share([bool(hits[i]) for i in idx])
            row[f"kb_{m}_residue"] = _share([_residue(hits[i], ps[i].fact) for i in idx])
        row["generated_residue"] = _share([_stated(del_on[i], ps[i].fact.value) for i in idx])
        per_kind[kind] = row
    at = {id(p): i for i, p in enumerate(ps)}
    return {"forgetting_residue_kb": _share([_residue(h, p.fact) for h, p in zip(kb_hits["entity"], ps)]),
            "forgetting_residue_kb_key_matching": _share([_residue(h, p.fact) for h, p in zip(kb_hits["key"], ps)]),
            "forgetting_residue_generated": _share([_stated(o, p.fact.value) for o, p in zip(del_on, ps)]),
            "forgetting_full_precision": _share([_stated(o, p.fact.value) for o, p in zip(full, base)]),
            "forgetting_full_kb_answered": _share([bool(m) for m in before_kb]),
            "forgetting_del_on_precision": _share([_stated(del_on[at[id(p)]], p.fact.value) for p in base]),
            "forgetting_parametric_leakage": _share([_stated(o, p.fact.value) for o, p in zip(del_off, base)]),
            "forgetting_n_facts": len(base), "forgetting_n_probes": len(ps), "forgetting_by_kind": per_kind}


def _records(ps: list[Probe], base: list[Probe], kb_hits: dict, states: dict) -> list[dict]:
    """One row per probe: the query, the KB's answers (or why not) and the generations of each state."""
    at = {id(p): j for j, p in enumerate(base)}
    out = []
    for i, p in enumerate(ps):
        rec = {**asdict(p.fact), "kind": p.kind, "query_entity": p.entity, "query_relation": p.relation,
               "probe_prompt": p.prompt, "del_on": states["del_on"][i],
               "del_on_states_value": _stated(states["del_on"][i], p.fact.value)}
        for m, hits in kb_hits.items():
            h = hits[i]
            rec[f"kb_{m}"] = ({"entity": h.entity, "relation": h.relation, "value": h.value} if h
                              else {"miss": getattr(h, "reason", None)})
        if id(p) in at:
            j = at[id(p)]
            rec.update(full=states["full"][j], full_states_value=_stated(states["full"][j], p.fact.value),
                       del_off=states["del_off"][j], del_off_states_value=_stated(states["del_off"][j], p.fact.value))
            if "start" in states:
                rec.update(start=states["start"][j], start_states_value=_stated(states["start"][j], p.fact.value))
        out.append(rec)
    return out


def sample_facts(facts: Sequence[Fact], n: int | None, seed: int = 0) -> list[Fact]:
    """At most ``n`` facts (all of an entity together, seeded choice of entities), in their order."""
    if not n or len(facts) <= n:
        return list(facts)
    entities = list(dict.fromkeys(f.entity for f in facts))
    random.Random(seed).shuffle(entities)
    keep, count = set(), 0
    for e in entities:
        if count >= n:
            break
        keep.add(e)
        count += sum(1 for f in facts if f.entity == e)
    return [f for f in facts if f.entity in keep]
