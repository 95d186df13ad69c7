"""The training documents a recipe makes of the annotated corpus, and its held-out facts: chunks headed
by their title or windows around each call, a fact source's sentences, and the ``facts`` cloze split."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from ..corpus import Document, read_documents
from .recipe import Recipe

__all__ = ["chunks", "plain_chunks", "fact_documents_of", "facts_split", "corpus_relation_facts", "infobox_split"]


def chunks(docs: list[Document], max_chars: int) -> list[Document]:
    """Documents cut into their paragraphs (one over ``max_chars`` characters at sentence ends), each headed by its
    document's title (``source``) on a line of its own, calls kept: a model reading a chunk always sees
    whose facts it states (an article's calls name the article's entity, which a block from its middle
    would not show). LMLM and Standard train on the same chunks; 0 keeps whole documents."""
    from ..annotate.validate import calls_with_offsets, insert_calls
    from ..annotate.passages import split_passages

    if not max_chars:
        return docs
    out = []
    for d in docs:
        calls = calls_with_offsets(d.segments)
        head = f"{d.source}\n" if d.source else ""
        for s, e in split_passages(d.text, max_chars, min_chars=1):  # no text left out
            inside = [(len(head) + q - s, c) for q, c in calls if s <= q < e]
            out.append(Document.from_segments(f"{d.id}@{s}", insert_calls(head + d.text[s:e], inside),
                                              source=d.source, split=d.split))
    return out


def plain_chunks(docs: list[Document], n: int, seed: int = 0, max_chars: int = 400) -> list[Document]:
    """A seeded sample of ``n`` paragraphs of ``docs`` that hold no call (:func:`chunks` of ``max_chars``,
    headed by their title; those under half of that left out): plain text beside the calls, so that a
    continued model keeps its language."""
    plain = [c for c in chunks(docs, max_chars) if not c.num_calls and len(c.text) >= max_chars // 2]
    if len(plain) > n:
        plain = sorted(random.Random(seed).sample(plain, n), key=plain.index)
    return [Document(f"plain/{c.id}", c.annotated, c.text, c.source, c.split, c.meta) for c in plain]


def infobox_split(recipe: Recipe, out: Path, folder: Path) -> Path | None:
    """The held-out articles' infobox facts as the ``heldout_infobox`` cloze split (LAMA T-REx records, at
    most ``cloze_per_split`` in turn from every relation, seeded), each asked as the training side's infobox
    sentences word theirs ("The highest point of Alaska is"): facts of articles no model read, which the
    corpus KB holds. A fact whose value the prompt already names ("The sport of American Football
    Conference is" American football) is left out. ``None`` when the split has none."""
    from ..data.facts import cloze_records, write_jsonl
    from ..evaluate.cloze import content_words

    facts = corpus_relation_facts(out, 1 << 30, recipe.seed, split="heldout")
    records = [r for r in cloze_records(facts, split="heldout_infobox")  # a value the prompt names is read off it
               if not set(content_words(r["obj_label"])) <= set(content_words(r["masked_sentences"][0]))]
    if not records:
        return None
    n = recipe.evaluate.cloze_per_split
    if n and len(records) > n:  # the first n: corpus_relation_facts takes every relation in turn
        records = records[:n]
    path = folder / "cloze" / "heldout_infobox.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(path, records)
    return path


def fact_documents_of(recipe: Recipe, out: Path, folder: Path, log=print) -> list[Document]:
    """The fact source's training documents (:mod:`lmlm.data.facts`); its held-out facts, about entities the
    corpus never names, go to ``facts-heldout.jsonl`` (triples) for the evaluation's own KB and cloze."""
    spec = recipe.facts
    if not spec.source:
        return []
    from ..data.facts import fact_documents, read_facts, split_by_entity, write_jsonl

    named = "\n".join(d.text for d in read_documents(out / "corpus" / "documents.jsonl"))
    train, held = split_by_entity(read_facts(spec.source), spec.hold_out, recipe.seed, named)
    write_jsonl(folder / "facts-heldout.jsonl", held)
    log(f"facts: {len(train)} facts of {len({e for e, _, _ in train})} entities on the training side "
         f"({min(len(train), spec.documents or len(train))} trained on), {len(held)} of "
         f"{len({e for e, _, _ in held})} entities no corpus text names held out ({spec.source})")
    if spec.documents and len(train) > spec.documents:
        train = sorted(random.Random(recipe.seed).sample(train, spec.documents), key=train.index)
    docs = fact_documents(train, seed=recipe.seed, prefix="facts") if spec.train else []
    if spec.corpus_relations:
        own = corpus_relation_facts(out, spec.corpus_relations, recipe.seed)
        log(f"facts: {len(own)} sentences from the training articles' infoboxes, "
            f"{len({r for _, r, _ in own})} relations")
        docs += fact_documents(own, seed=recipe.seed, prefix="infobox")
    return docs


def corpus_relation_facts(out: Path, n: int, seed: int = 0, split: str = "train") -> list[tuple[str, str, str]]:
    """At most ``n`` infobox facts of the corpus's articles of ``split`` (``train``: the training articles,
    ``heldout``: those no model reads) from ``OUT/annotate/triples.jsonl``, of their relation's kind and with
    a word in the value and not the entity's own name, taken in turn from every relation (seeded)."""
    from ..annotate.support import fits_kind
    from ..kb.formats import read

    path = out / "annotate" / "triples.jsonl"
    if not path.exists():
        return []
    docs = {d.id for d in read_documents(out / "corpus" / "documents.jsonl") if (d.split or "train") == split}
    by_relation: dict[str, list[tuple[str, str, str]]] = {}
    for t in read(path)[0]:
        if (any(doc in docs for doc, _ in t.sources) and fits_kind(t.relation, t.value)
                and sum(c.isalpha() for c in t.value) >= 2 and t.value.casefold() != t.entity.casefold()):
            by_relation.setdefault(t.relation, []).append((t.entity, t.relation, t.value))
    rng = random.Random(seed)
    for facts in by_relation.values():
        rng.shuffle(facts)
    taken: list[tuple[str, str, str]] = []
    depth = 0
    while len(taken) < n and any(len(f) > depth for f in by_relation.values()):
        taken += [f[depth] for f in by_relation.values() if len(f) > depth][:n - len(taken)]
        depth += 1
    return taken


def facts_split(recipe: Recipe, held: Path, folder: Path) -> int:
    """The held-out facts of ``recipe.facts`` as the ``facts`` cloze split (at most ``cloze_per_split``, seeded)
    and their KB, ``eval/kb-facts``; the number of prompts."""
    if not recipe.facts.source or not held.exists() or not held.stat().st_size:
        return 0
    from ..data.facts import cloze_records, read_facts, write_jsonl
    from ..kb import build

    records = cloze_records(read_facts(held), split="facts")
    n = recipe.evaluate.cloze_per_split
    if n and len(records) > n:
        records = sorted(random.Random(recipe.seed).sample(records, n), key=records.index)
    write_jsonl(folder / "cloze" / "facts.jsonl", records)
    kb = folder / "kb-facts"
    if kb.exists():  # a few hundred facts: made again by a resumed stage rather than trusted half-built
        shutil.rmtree(kb)
    build(kb, held, who="lmlm pipeline", why=f"recipe {recipe.name}: facts about entities no corpus text names").close()
    return len(records)
