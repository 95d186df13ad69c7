"""Knowledge editing measured by the editing field's own protocol: CounterFact and zsRE, sequential edits.

An LMLM edits a fact by updating its KB (:meth:`lmlm.kb.KnowledgeBase.edit`); the field edits a model's
weights (FT-L, ROME: :mod:`lmlm.evaluate.weight_editing`, on a Standard model). ``lmlm eval editing``
applies the first N requested rewrites of a set one after another (1, 100, 1,000, 10,000: each count
a fresh start from the same weights and KB) and scores every count with the metrics ROME and MEMIT
define, each with its n and the seconds the edits took.

Metrics, for a CounterFact record (``target_true`` the old object, ``target_new`` the new one) and ``p``
the probability of an object's tokens as the text goes on, per token (``exp`` of the mean token
log-probability, ROME's ``test_batch_prediction``):

* ``efficacy_score``: share of edit prompts with ``p(new) > p(true)``; ``efficacy_magnitude``: mean
  ``p(new) - p(true)``. ``paraphrase_score`` / ``_magnitude``: the same on the paraphrase prompts;
* ``neighborhood_score``: share of neighbourhood prompts (other subjects, same relation, whose true
  object is ``target_true``) with ``p(true) > p(new)``; ``neighborhood_magnitude``: mean ``p(true) - p(new)``;
* ``*_accuracy``: share whose greedy answer states the object (new on edit and paraphrase prompts,
  true on neighbourhood prompts) among its first five content words
  (:func:`lmlm.evaluate.cloze.match_first_content_words`, the repository's cloze rule);
  ``*_top1``: the object's tokens teacher-forced, share that are the model's argmax (zsRE's
  top-1 token accuracy, MEND's and ROME's metric), on edit, paraphrase and locality prompts;
* ``unedited_*``: the same prompts before any edit, with the true object: ``unedited_precision``
  (greedy answer states the true object) is the model's precision on the facts before they were edited,
  ``unedited_score`` the share with ``p(true) > p(new)``;
* ``neighborhood_unchanged`` / ``locality_unchanged``: share of neighbourhood / locality prompts whose
  greedy answer (its first sentence: what follows may be about someone else, whose fact was edited;
  locality: the argmax tokens over ``loc_ans``) is the same before and after the edits;
* ``fluency``: ROME's generation entropy, per text ``mean(2/3 * H_2, 4/3 * H_3)`` of its word bigram
  and trigram frequencies (bits; NLTK's word tokenizer), averaged over the texts the model writes from
  the generation prompts (top-5 sampling, seeded, 100 tokens each, as ROME's ``generate_fast``: a
  text runs on past the end of its document, so an edit that makes the model end early does not shorten it;
  end-of-document and chat-turn tokens are never drawn, so a model trained on short documents writes 100
  tokens of text too; an LMLM's calls come on top of them, and its text is cut at 100 tokens);
  ``fluency_before`` and ``fluency_change`` (after / before - 1) beside it.

For an LMLM the answer comes through a lookup, so every metric is defined through it: a lookup is
forced at the answer position (the end of the prompt, as the cloze evaluations do with
``force_lookup=True``), the model writes entity and relation, the KB returns the value, and ``p`` is
the probability of the object's tokens as the text continues after ``<|db_end|>``; the greedy answer
is the text after the call. An edit then costs what the lookup costs: it moves an answer exactly
when the model's query reaches the edited key, so efficacy after the edits is the model's precision
on the unedited facts, and a prompt about another key answers as before. A call the model does not
finish within the budget leaves no continuation to score: the item counts as a failure.

Sets: CounterFact's records (``case_id``, ``requested_rewrite`` {``prompt`` with ``{}``, ``subject``,
``relation_id``, ``target_new`` {``str``}, ``target_true`` {``str``}}, ``paraphrase_prompts``,
``neighborhood_prompts``, ``generation_prompts``) and zsRE's (MEND's ``zsre_mend_eval.json``:
``subject``, ``src``, ``rephrase``, ``alt``, ``answers``, ``loc``, ``loc_ans``), read from a path; the
writers make both from a KB's facts (and a biography world's phrasings). An LMLM's edit is the KB key
``(subject, relation_id)`` (zsRE: a ``relation`` field the writer adds), so a set written from its KB
names the relations as the KB does.

Exercised by ``lmlm eval editing``.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..jsonio import write_json
from .base import CALL_ROOM, Protocol, mean, read_json_records, scratch_kb
from .cloze import match_first_content_words

__all__ = ["EDITING", "EditCase", "read_counterfact", "read_zsre", "read_edit_set", "counterfact_records",
           "zsre_records", "write_records", "kb_facts", "world_facts", "n_gram_entropy", "LookupScorer",
           "PlainScorer", "KBEditor", "WeightEditor", "run_editing", "parse_counts", "bad_counts"]

EDITING = Protocol("editing", "editing_efficacy_score",
                   paper="CounterFact (Meng et al., 2022, ROME) and zsRE (Levy et al., 2017; MEND's split), "
                         "sequential edits as MEMIT measures them")


@dataclass(frozen=True)
class EditCase:
    """One requested rewrite and the prompts that score it (either format)."""

    case_id: int | str
    subject: str
    relation: str | None
    template: str  # the edit prompt with ``{}`` where the subject goes
    target_new: str
    target_true: str | None
    paraphrases: tuple[str, ...] = ()
    neighborhood: tuple[str, ...] = ()
    generation: tuple[str, ...] = ()
    locality: tuple[tuple[str, str], ...] = ()  # zsRE: (prompt, its answer)
    format: str = "counterfact"

    @property
    def prompt(self) -> str:
        return self.template.replace("{}", self.subject)

    @property
    def key(self) -> tuple[str, str]:
        """The fact edited: ``(subject, relation)`` (the prompt when no relation is named)."""
        return (self.subject, self.relation if self.relation is not None else self.prompt)


# -- reading ---------------------------------------------------------------------------------------------

def _text(rec: dict, name: str, where: str) -> str:
    v = rec.get(name)
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{where}: {name!r} must be a non-empty text, got {v!r}")
    return v


def _texts(rec: dict, name: str, where: str) -> tuple[str, ...]:
    v = rec.get(name) or []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"{where}: {name!r} must be a list of texts, got {v!r}")
    return tuple(v)


def _counterfact_case(rec, where: str) -> EditCase:
    if not isinstance(rec, dict) or not isinstance(rec.get("requested_rewrite"), dict):
        raise ValueError(f"{where}: a CounterFact record needs 'requested_rewrite', an object")
    rw = rec["requested_rewrite"]
    template, subject = _text(rw, "prompt", where), _text(rw, "subject", where)
    if "{}" not in template:
        raise ValueError(f"{where}: requested_rewrite.prompt {template!r} has no {{}} for the subject")
    targets = []
    for name in ("target_new", "target_true"):
        t = rw.get(name)
        if not isinstance(t, dict):
            raise ValueError(f"{where}: requested_rewrite.{name} must be an object with 'str', got {t!r}")
        targets.append(_text(t, "str", f"{where}: requested_rewrite.{name}").strip())
    return EditCase(rec.get("case_id", where), subject, rw.get("relation_id"), template, targets[0], targets[1],
                    _texts(rec, "paraphrase_prompts", where), _texts(rec, "neighborhood_prompts", where),
                    _texts(rec, "generation_prompts", where))


def _zsre_case(rec, where: str, n: int) -> EditCase:
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected an object, got {type(rec).__name__}")
    subject, src = _text(rec, "subject", where), _text(rec, "src", where)
    answers = _texts(rec, "answers", where)
    if not answers:
        raise ValueError(f"{where}: 'answers' is empty")
    if subject not in src:
        raise ValueError(f"{where}: the subject {subject!r} is not in src {src!r}")
    loc = ((_text(rec, "loc", where), _text(rec, "loc_ans", where)),) if rec.get("loc") is not None else ()
    return EditCase(rec.get("case_id", n), subject, rec.get("relation"), src.replace(subject, "{}", 1),
                    _text(rec, "alt", where).strip(), answers[0].strip(), _texts(rec, "rephrase", where),
                    locality=loc, format="zsre")


def read_counterfact(path: str | Path) -> list[EditCase]:
    """CounterFact records (``counterfact.json``: a JSON list); a bad record is named by file and number."""
    return [_counterfact_case(r, f"{path}: record {n}") for n, r in enumerate(read_json_records(path), 1)]


def read_zsre(path: str | Path) -> list[EditCase]:
    """zsRE records in MEND's format (``zsre_mend_eval.json``); a bad record is named by file and number."""
    return [_zsre_case(r, f"{path}: record {n}", n - 1) for n, r in enumerate(read_json_records(path), 1)]


def read_edit_set(path: str | Path) -> list[EditCase]:
    """A CounterFact or zsRE file, told apart by its first record's fields."""
    records = read_json_records(path)
    if not records:
        raise ValueError(f"{path}: no records")
    first = records[0] if isinstance(records[0], dict) else {}
    if "requested_rewrite" in first:
        return [_counterfact_case(r, f"{path}: record {n}") for n, r in enumerate(records, 1)]
    if "src" in first and "alt" in first:
        return [_zsre_case(r, f"{path}: record {n}", n - 1) for n, r in enumerate(records, 1)]
    raise ValueError(f"{path}: record 1 is neither CounterFact ('requested_rewrite') nor zsRE ('src', 'alt'); "
                     f"its fields: {sorted(first)}")


# -- writing sets from a KB --------------------------------------------------------------------------------

def kb_facts(kb) -> dict[tuple[str, str], str]:
    """``(entity, relation) -> value`` of the KB's active facts (the first row of a key)."""
    out: dict[tuple[str, str], str] = {}
    for t in kb.triples():
        out.setdefault((t.entity, t.relation), t.value)
    return out


def world_facts(world, split: str = "train") -> dict[tuple[str, str], str]:
    """The facts of a biography world's people of ``split`` (those its KB holds at training time)."""
    return {(p.name, r): v for p in world.people_in(split) for r, v in p.facts.items()}


def _phrasings(world) -> Callable[[str, str], list[str]]:
    """``(entity, relation) -> prompts``, the first the edit prompt: the world's own templates, or for
    any other KB ``"The <relation> of <entity> is"`` and the relation's paraphrases."""
    if world is not None:
        return world.phrasings
    from .forgetting import relation_paraphrases

    def generic(entity: str, relation: str) -> list[str]:
        words = [relation.lower(), *relation_paraphrases(relation)]
        return [f"The {w} of {entity} is" for w in dict.fromkeys(words)]
    return generic


@dataclass
class _Plan:
    """The rewrites of a set: which facts, in what order, the new object of each, the neighbours."""

    rewrites: list[tuple[tuple[str, str], str, str]]  # (key, true, new)
    neighbours: dict[tuple[str, str], list[str]]  # key -> other subjects, same relation and value
    facts: dict[tuple[str, str], str] = field(repr=False, default_factory=dict)


def _plan(facts: dict[tuple[str, str], str], n: int, seed: int, n_neighbours: int) -> _Plan:
    """``n`` rewrites over half the subjects (seeded); the other half are neighbourhood subjects, so no
    neighbour's fact is edited. Past the edited half's facts the rewrites go round again, each time to
    another new value: a later rewrite of a fact supersedes the earlier one."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = random.Random(seed)
    subjects = sorted({e for e, _ in facts})
    rng.shuffle(subjects)
    edited = set(subjects[:max(1, len(subjects) // 2)])
    keys = [k for k in sorted(facts) if k[0] in edited]
    rng.shuffle(keys)
    values: dict[str, list[str]] = {}
    for (_, r), v in sorted(facts.items()):
        values.setdefault(r, {})[v] = None
    values = {r: list(vs) for r, vs in values.items()}
    keys = [k for k in keys if len(values[k[1]]) > 1]  # a relation with one value has nothing to edit it to
    if not keys:
        raise ValueError("no fact can be edited: every relation has a single value")
    by_value: dict[tuple[str, str], list[str]] = {}
    for (e, r), v in sorted(facts.items()):
        if e not in edited:
            by_value.setdefault((r, v), []).append(e)
    rewrites, last = [], {}
    for i in range(n):
        key = keys[i % len(keys)]
        true = facts[key]
        pool = values[key[1]]
        new = rng.choice(pool)
        while new == true or (new == last.get(key) and len(pool) > 2):
            new = rng.choice(pool)
        last[key] = new
        rewrites.append((key, true, new))
    neighbours = {k: rng.sample(pool, min(n_neighbours, len(pool)))
                  for k in keys if (pool := by_value.get((k[1], facts[k]), []))}
    return _Plan(rewrites, neighbours, facts)


def counterfact_records(facts: dict[tuple[str, str], str], n: int, *, world=None, seed: int = 0,
                        n_paraphrases: int = 2, n_neighbours: int = 2) -> list[dict]:
    """``n`` CounterFact records of ``facts`` (``(entity, relation) -> value``; :func:`kb_facts`,
    :func:`world_facts`): the edit prompt (the relation's first phrasing, ``{}`` for the subject),
    ``n_paraphrases`` other phrasings, the first phrasing of up to ``n_neighbours`` other subjects with the
    same relation and true object, and the edit and paraphrase prompts as generation prompts; the new
    object is another value of the same relation, chosen with ``seed``. ``relation_id`` is the KB's relation."""
    plan, say = _plan(facts, n, seed, n_neighbours), _phrasings(world)
    out = []
    for i, ((subject, relation), true, new) in enumerate(plan.rewrites):
        prompts = say(subject, relation)
        out.append({
            "case_id": i,
            "requested_rewrite": {"prompt": prompts[0].replace(subject, "{}", 1), "subject": subject,
                                  "relation_id": relation, "target_new": {"str": new}, "target_true": {"str": true}},
            "paraphrase_prompts": prompts[1:1 + n_paraphrases],
            "neighborhood_prompts": [say(o, relation)[0] for o in plan.neighbours.get((subject, relation), [])],
            "generation_prompts": prompts[:1 + n_paraphrases],
        })
    return out


def zsre_records(facts: dict[tuple[str, str], str], n: int, *, world=None, seed: int = 0) -> list[dict]:
    """``n`` zsRE records (MEND's fields) of ``facts``: ``src`` the edit prompt, ``rephrase`` a paraphrase,
    ``alt`` the new object, ``answers`` the true one, ``loc``/``loc_ans`` a prompt about a subject that is
    not edited and its answer; plus ``relation``, the KB key's relation (not in MEND's files; an LMLM's
    edit needs it). The prompts are the world's statements cut before the value (it has no questions)."""
    plan, say = _plan(facts, n, seed, 1), _phrasings(world)
    others = sorted(k for k in plan.facts if k[0] not in {key[0] for key, _, _ in plan.rewrites})
    rng = random.Random(seed + 1)
    out = []
    for i, ((subject, relation), true, new) in enumerate(plan.rewrites):
        prompts = say(subject, relation)
        loc = rng.choice(others) if others else None
        rec = {"case_id": i, "subject": subject, "relation": relation, "src": prompts[0],
               "rephrase": prompts[1] if len(prompts) > 1 else prompts[0], "alt": new, "answers": [true]}
        if loc is not None:
            rec.update(loc=say(*loc)[0], loc_ans=plan.facts[loc])
        out.append(rec)
    return out


def write_records(path: str | Path, records: list[dict]) -> Path:
    """Write a set as the official files are: one JSON list."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, records, indent=1, ensure_ascii=False)
    return path


# -- fluency -----------------------------------------------------------------------------------------------

def _words(text: str) -> list[str]:
    import nltk

    try:
        return nltk.word_tokenize(text)
    except LookupError:  # no punkt sentence model installed: the same word rules over the whole text
        return nltk.word_tokenize(text, preserve_line=True)


def _entropy(words: list[str], n: int) -> float:
    from collections import Counter

    counts = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    total = sum(counts.values())
    return -sum(c / total * math.log2(c / total) for c in counts.values()) if total else 0.0


def n_gram_entropy(texts: Sequence[str]) -> float:
    """ROME's fluency: per text ``mean(2/3 * H_2, 4/3 * H_3)`` (bits), averaged over the texts.

    Examples:
        >>> round(n_gram_entropy(["a b c d"]), 4)  # three distinct bigrams, two trigrams
        1.195
    """
    per = [mean([2 / 3 * _entropy(w, 2), 4 / 3 * _entropy(w, 3)]) for w in map(_words, texts)]
    return mean(per)


# -- scoring: what a model answers and how likely each object is after a prompt ---------------------------

@dataclass
class Scored:
    """One prompt: the greedy answer, and per object its mean token log-probability and top-1 token accuracy."""

    answer: str
    logp: dict[str, float]
    top1: dict[str, float]
    argmax: dict[str, tuple[int, ...]]


class _Scorer:
    _call_room = 0  # tokens a row may write beyond its text: its calls

    def __init__(self, gen, batch_size: int = 32, max_new_tokens: int = 16):
        self.gen, self.tok, self.batch_size, self.max_new_tokens = gen, gen.tok, batch_size, max_new_tokens

    def _object_ids(self, prompt: str, obj: str) -> list[int]:
        """The object's tokens as the text goes on after the prompt (``" " + obj``, tokenized with it)."""
        p, full = self.tok.encode_text(prompt), self.tok.encode_text(prompt + " " + obj)
        return full[len(p):] if full[:len(p)] == p else self.tok.encode_text(" " + obj)

    def score(self, items: Sequence[tuple[str, Sequence[str]]]) -> list[Scored]:
        """Each ``(prompt, objects)``: the greedy answer, and the objects scored after the prefix."""
        from ..scoring import token_logprobs

        if not items:
            return []
        prefixes, answers = self._prefixes([p for p, _ in items])
        seqs, where = [], []
        for i, ((prompt, objs), pre) in enumerate(zip(items, prefixes)):
            for o in objs:
                if pre is not None:
                    where.append((i, o, len(pre)))
                    seqs.append(pre + self._object_ids(prompt, o))
        out = [Scored(a, {o: -math.inf for o in objs}, {o: 0.0 for o in objs}, {o: () for o in objs})
               for a, (_, objs) in zip(answers, items)]
        scored = token_logprobs(self.gen.model, seqs, batch_size=self.batch_size, greedy=True,
                                banned=self._banned()) if seqs else []
        for (i, o, start), seq, (lp, hit) in zip(where, seqs, scored):
            span = slice(start - 1, len(seq) - 1)  # entry t scores seq[t + 1]
            out[i].logp[o] = float(lp[span].mean())
            out[i].top1[o] = float(hit[span].mean())
            out[i].argmax[o] = tuple(bool(h) for h in hit[span])
        return out

    def _banned(self):
        return ()

    def generate(self, prompts: Sequence[str], max_new_tokens: int = 100, seed: int = 0) -> list[str]:
        """Texts from the generation prompts, ROME's way (top-5 sampling, seeded, ``max_new_tokens`` each,
        as ``generate_fast`` does). The end of a document does not stop a text: the special tokens (a
        document's end, a chat turn's markers) are never drawn, so that a model trained to end its
        documents early writes ``max_new_tokens`` of text too, not a few words between end tokens."""
        from .base import outputs_of

        hf = self.tok.hf
        specials = {*getattr(hf, "all_special_ids", ()), self.tok.eos_id, self.tok.doc_id} - set(self.tok.call_ids)
        res = self.gen.generate(list(prompts), max_new_tokens=max_new_tokens + self._call_room,
                                batch_size=self.batch_size, do_sample=True, top_k=5, seed=seed, ignore_eos=True,
                                suppress_ids=sorted(i for i in specials if i is not None and i < len(hf)))
        # ``max_new_tokens`` of text for every model: an LMLM's calls come on top (CALL_ROOM), as in answers
        return [hf.decode(ids[:max_new_tokens]) if len(ids := hf.encode(o, add_special_tokens=False)) > max_new_tokens
                else o for o in outputs_of(self.gen, res)]


class LookupScorer(_Scorer):
    """An LMLM through its lookups: a call forced at the end of each prompt, the KB answering it; the
    prefix an object is scored after is the prompt and that call up to its ``<|db_end|>``."""

    _call_room = CALL_ROOM

    def _prefixes(self, prompts):
        from .base import outputs_of
        from ..generate.trace import open_call

        res = self.gen.generate(list(prompts), max_new_tokens=self.max_new_tokens + CALL_ROOM // 2,
                                batch_size=self.batch_size, force_lookup=True)
        prefixes = []
        for p, r in zip(prompts, res):
            row = self.gen.prompt_ids(p, force_lookup=True)
            full = row[:len(row) - len(open_call(row, self.tok))] + list(r.token_ids)
            ends = [j for j in range(len(row) - 1, len(full)) if full[j] == self.tok.end_id]
            prefixes.append(full[:ends[0] + 1] if ends else None)
        return prefixes, outputs_of(self.gen, res, self.max_new_tokens)


class PlainScorer(_Scorer):
    """A model without lookups (a Standard model, or an LMLM with its lookup tokens banned): the prefix is
    the prompt; the greedy answer its plain continuation."""

    def _prefixes(self, prompts):
        from .base import outputs_of

        res = self.gen.generate(list(prompts), max_new_tokens=self.max_new_tokens, batch_size=self.batch_size)
        return [self.gen.prompt_ids(p) for p in prompts], outputs_of(self.gen, res)

    def _banned(self):
        return self.tok.call_ids


# -- editors ----------------------------------------------------------------------------------------------

class KBEditor:
    """An LMLM's edit: ``KnowledgeBase.edit(subject, relation, new)`` on a fresh copy of the KB per count
    (a key the KB does not hold is added). ``source``: the KB folder; ``make_generator(kb)`` the LMLM's
    generator over a copy; ``batch_size``: rows per scoring and generation batch."""

    name = "lmlm"

    def __init__(self, source: str | Path, make_generator, batch_size: int = 32):
        self.source, self.make_generator, self.batch_size = Path(source), make_generator, batch_size
        self.kb, self._tmp = None, None
        self.inserted = 0

    def start(self):
        """A fresh copy of the KB (the previous one removed); returns the scorer over it."""
        self.close()
        self.kb, self._tmp = scratch_kb(self.source, "lmlm-editing-kb-")
        self.inserted = 0
        return LookupScorer(self.make_generator(self.kb), batch_size=self.batch_size)

    def apply(self, cases: Sequence[EditCase], progress=None) -> None:
        from ..kb import KBError, Triple

        for c in cases:
            if c.relation is None:
                raise ValueError(f"case {c.case_id}: no relation names the KB key to edit (zsRE records need "
                                 "'relation' for an LMLM: the writers add it)")
            try:
                self.kb.edit(c.subject, c.relation, c.target_new, who="lmlm eval editing", why=f"case {c.case_id}")
            except KBError:  # no active value: the rewrite inserts the fact
                self.kb.add([Triple(c.subject, c.relation, c.target_new)], who="lmlm eval editing",
                            why=f"case {c.case_id}")
                self.inserted += 1
            if progress is not None:
                progress()

    def close(self) -> None:
        import shutil

        if self.kb is not None:
            self.kb.close()
            self.kb = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


class WeightEditor:
    """FT-L or ROME (:mod:`lmlm.evaluate.weight_editing`) through the edit loop: ``start`` restores the
    weights, ``apply`` edits them one rewrite after another; ``gen`` scores the model without a KB
    (``batch_size`` rows a batch)."""

    def __init__(self, method, gen, batch_size: int = 32):
        self.method, self.gen, self.name, self.batch_size = method, gen, method.name, batch_size
        self.inserted = 0

    def start(self):
        self.method.reset()
        return PlainScorer(self.gen, batch_size=self.batch_size)

    def apply(self, cases: Sequence[EditCase], progress=None) -> None:
        from .weight_editing import WeightEdit

        self.method.edit_all([WeightEdit(c.prompt, c.subject, c.target_new) for c in cases], progress)

    def close(self) -> None:
        self.method.reset()


# -- the protocol ----------------------------------------------------------------------------------------

def parse_counts(text: str) -> list[int]:
    """``"1,100,1000"`` -> ``[1, 100, 1000]`` (each a positive integer; ``10k`` = 10,000)."""
    out = []
    for part in text.split(","):
        part = part.strip().lower().replace("_", "")
        if not part:
            continue
        mult = 1000 if part.endswith("k") else 1
        try:
            n = int(part[:-1] if mult > 1 else part) * mult
        except ValueError:
            raise ValueError(f"--edits takes counts separated by commas, got {text!r}") from None
        if n < 1:
            raise ValueError(f"--edits counts must be >= 1, got {n}")
        out.append(n)
    if not out:
        raise ValueError(f"--edits takes counts separated by commas, got {text!r}")
    return sorted(set(out))


def bad_counts(counts: Sequence) -> bool:
    """Whether ``counts`` (sequential edit counts from a config) holds anything but integers of at least 1."""
    return any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts)


def _final(cases: Sequence[EditCase]) -> list[int]:
    """Indices of the last rewrite of each fact, in order of first edit: what the model should state after them all."""
    last: dict = {}
    for i, c in enumerate(cases):
        last[c.key] = i
    return list(last.values())


def _items(cases: Sequence[EditCase]) -> tuple[list, list]:
    """Every prompt to score for ``cases`` with its objects, and ``(case index, kind, prompt index)`` of each."""
    items, where = [], []
    for i, c in enumerate(cases):
        objs = (c.target_new,) + ((c.target_true,) if c.target_true else ())
        rows = [("edit", c.prompt, objs)] + [("paraphrase", p, objs) for p in c.paraphrases] + \
               [("neighborhood", p, objs) for p in c.neighborhood] + [("locality", p, (a,)) for p, a in c.locality]
        for j, (kind, prompt, o) in enumerate(rows):
            items.append((prompt, o))
            where.append((i, kind, j))
    return items, where


def _first_sentence(text: str) -> str:
    import re

    return re.split(r"(?<=[.!?])\s|\n", text.strip(), maxsplit=1)[0]


def _state(scorer, cases: Sequence[EditCase]) -> dict:
    """``(case index, kind, prompt index) -> Scored`` for every prompt of ``cases``."""
    items, where = _items(cases)
    return dict(zip(where, scorer.score(items)))


def _summary(cases: Sequence[EditCase], before: dict, after: dict) -> dict:
    """The metrics of one count (see the module docstring) from the scores before and after the edits."""
    acc: dict[str, list[float]] = {}

    def add(name, value):
        acc.setdefault(name, []).append(float(value))
    for (ci, kind, j), s in after.items():
        c, b = cases[ci], before[(ci, kind, j)]
        new, true = c.target_new, c.target_true
        if kind == "locality":
            _, ans = c.locality[j - 1 - len(c.paraphrases) - len(c.neighborhood)]
            add("locality_top1", s.top1[ans])
            add("unedited_locality_top1", b.top1[ans])
            add("locality_unchanged", s.argmax[ans] == b.argmax[ans])
            continue
        add(f"{kind}_accuracy", match_first_content_words(s.answer, true if kind == "neighborhood" else new))
        if kind != "neighborhood":
            add(f"{kind}_top1", s.top1[new])
        if true:
            lead, other = (true, new) if kind == "neighborhood" else (new, true)
            add(f"{kind}_score", s.logp[lead] > s.logp[other])
            add(f"{kind}_magnitude", math.exp(s.logp[lead]) - math.exp(s.logp[other]))
        if kind == "neighborhood":
            add("neighborhood_unchanged", _first_sentence(s.answer) == _first_sentence(b.answer))
            add("unedited_neighborhood_accuracy", match_first_content_words(b.answer, true))
        if kind == "edit" and true:
            add("unedited_precision", match_first_content_words(b.answer, true))
            add("unedited_score", b.logp[true] > b.logp[new])
    out = {}
    for name, values in sorted(acc.items()):
        out[name] = round(mean(values), 4)
        out[f"n_{name}"] = len(values)
    return out


def _scored_cases(final: Sequence[int], sample: int | None, seed: int) -> list[int]:
    if not sample or len(final) <= sample:
        return list(final)
    keep = set(random.Random(seed).sample(range(len(final)), sample))
    return [c for i, c in enumerate(final) if i in keep]


def _fluency(scorer, cases: Sequence[EditCase], n: int, max_new_tokens: int, seed: int) -> tuple[float, list[str]]:
    """ROME's fluency of the texts written from the first generation prompt of each of ``cases`` (up to ``n``),
    and the texts."""
    prompts = [p for c in cases for p in c.generation[:1]][:n]
    if not prompts:
        return math.nan, []
    texts = scorer.generate(prompts, max_new_tokens=max_new_tokens, seed=seed)
    return n_gram_entropy(texts), texts


def run_editing(editor, cases: Sequence[EditCase], counts: Sequence[int], *, sample: int | None = 1000,
                fluency_n: int = 50, fluency_tokens: int = 100, seed: int = 0, log=print,
                records: list | None = None) -> dict:
    """Edit the first N of ``cases`` in order for each N of ``counts`` (each from a fresh start), score each
    count, and return the metrics ``editing_<N>_<metric>`` (and ``editing_<metric>`` of the largest count).

    ``sample``: at most this many of a count's edited facts are scored (seeded; every edit is applied and
    timed); ``fluency_n`` generation prompts, ``fluency_tokens`` tokens each, for the fluency."""
    from tqdm.auto import tqdm

    counts = sorted(counts)
    if counts[-1] > len(cases):
        raise ValueError(f"--edits {counts[-1]}: the set has {len(cases)} rewrites")
    scored = {n: _scored_cases(_final(cases[:n]), sample, seed) for n in counts}
    union = sorted({i for n in counts for i in scored[n]})  # indices into cases
    scorer = editor.start()
    log(f"editing: scoring {len(union)} rewrites' prompts before any edit ({editor.name})")
    before = _state(scorer, [cases[i] for i in union])
    at = {i: u for u, i in enumerate(union)}
    flu_cases = [cases[i] for i in scored[counts[-1]]]
    fluency_before, texts_before = _fluency(scorer, flu_cases, fluency_n, fluency_tokens, seed)
    metrics: dict = {"editing_fluency_before": round(fluency_before, 4), "editing_n_fluency": len(texts_before)}
    for n in counts:
        scorer = editor.start()
        bar = tqdm(total=n, desc=f"{editor.name}: {n} edits", unit="edit", leave=False)
        t0 = time.perf_counter()
        editor.apply(cases[:n], progress=lambda: bar.update(1))
        seconds = time.perf_counter() - t0
        bar.close()
        chosen = [cases[i] for i in scored[n]]
        after = _state(scorer, chosen)
        mine = {(k, kind, j): before[(at[scored[n][k]], kind, j)] for k, kind, j in after}
        row = _summary(chosen, mine, after)
        flu, texts = _fluency(scorer, flu_cases, fluency_n, fluency_tokens, seed)
        row.update(fluency=round(flu, 4), fluency_change=round(flu / fluency_before - 1, 4) if fluency_before else None,
                   edits=n, facts_edited=len(_final(cases[:n])), n_cases=len(chosen), edit_seconds=round(seconds, 3),
                   seconds_per_edit=round(seconds / n, 6), kb_inserted=editor.inserted)
        log(f"editing: {n} edits in {seconds:.1f} s: efficacy {row.get('edit_score', row.get('edit_top1'))}, "
            f"neighborhood {row.get('neighborhood_score', row.get('locality_top1'))}, fluency {row['fluency']}")
        metrics.update({f"editing_{n}_{k}": v for k, v in _renamed(row).items()})
        if records is not None:
            records.append({"edits": n, **_renamed(row), "cases": _case_records(chosen, mine, after),
                            "fluency_texts": [{"before": b, "after": a} for b, a in zip(texts_before, texts)]})
    editor.close()
    metrics.update({f"editing_{k}": v for k, v in _renamed(row).items()})  # the largest count's
    return metrics


def _case_records(cases: Sequence[EditCase], before: dict, after: dict) -> list[dict]:
    """Each scored rewrite as it reads: its prompts with the greedy answer before and after the edits."""
    out = []
    for ci, c in enumerate(cases):
        rows: dict[str, list] = {}
        prompts = [prompt for prompt, _ in _items([c])[0]]
        for (i, kind, j), s in after.items():
            if i == ci:
                rows.setdefault(kind, []).append({"prompt": prompts[j], "before": before[(i, kind, j)].answer,
                                                  "after": s.answer})
        out.append({"case_id": c.case_id, "subject": c.subject, "relation": c.relation, "target_true": c.target_true,
                    "target_new": c.target_new, **{k: (v[0] if k == "edit" else v) for k, v in rows.items()}})
    return out


def _renamed(row: dict) -> dict:
    """``edit_*`` as the field names them: ``efficacy_*``."""
    return {k.replace("edit_", "efficacy_", 1) if k.startswith(("edit_", "n_edit_")) and not k.startswith("edit_seconds")
            else k: v for k, v in row.items()}
