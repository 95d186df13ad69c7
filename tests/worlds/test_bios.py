"""The synthetic biography world: determinism, annotation rule, KB triples, splits and evaluation sets."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from lmlm.lookup import Lookup, Text, parse, render, strip
from lmlm.worlds import BIOS_PRESETS, CLOZE_TEMPLATES, RELATIONS, TEMPLATES, BiosConfig, BiosWorld
from lmlm.worlds.bios import COMPILED, fill


@pytest.fixture(scope="module")
def world() -> BiosWorld:
    return BiosWorld.generate("smoke")


@pytest.fixture(scope="module")
def default_world() -> BiosWorld:
    return BiosWorld.generate("default")


def _texts(w: BiosWorld) -> list[str]:
    return [d.annotated for d in w.train_documents + w.heldout_documents]


def test_same_seed_same_world_and_different_seed_different_world(world):
    again = BiosWorld.generate(BiosConfig.from_name("smoke"))
    assert again == world
    assert _texts(again) == _texts(world)
    other = BiosWorld.generate(BiosConfig.from_name("smoke", seed=1))
    assert _texts(other) != _texts(world)
    assert [p.name for p in other.people] != [p.name for p in world.people]


def test_every_value_follows_its_call_and_belongs_to_the_document_person(world):
    for doc in world.train_documents + world.heldout_documents:
        person = world.person(doc.person)
        segs = doc.segments
        assert isinstance(segs[0], Text) and isinstance(segs[-1], Text)
        for i, seg in enumerate(segs):
            if isinstance(seg, Lookup):
                assert segs[i - 1].text.endswith(" ") and not segs[i - 1].text.endswith("  ")
                assert isinstance(segs[i + 1], Text) and segs[i + 1].text.startswith(" " + seg.value)
                assert seg.entity == doc.person
                assert seg.value == person.facts[seg.relation]
        # the entity is named before the first call: it is inferable from the left context
        first_call = next(i for i, s in enumerate(segs) if isinstance(s, Lookup))
        assert doc.person in segs[first_call - 1].text


def test_stripped_text_is_clean_and_annotation_round_trips(world):
    for doc in world.train_documents + world.heldout_documents:
        plain = doc.plain
        assert "dblookup" not in plain and "<|" not in plain and "->" not in plain
        assert "  " not in plain and plain == plain.strip()
        for lk in doc.lookups:
            assert f" {lk.value}" in plain or plain.startswith(lk.value)
        parsed = parse(doc.annotated, strict=True)
        assert parsed.segments == doc.segments
        assert parse(render(doc.segments, form="tokens"), strict=True).segments == doc.segments


def test_triples_hold_every_train_fact_with_its_sources(world):
    triples = world.triples()
    rows = set(triples)
    stated = set()
    for doc in world.train_documents:
        for lk in doc.lookups:
            assert (lk.entity, lk.relation, lk.value, doc.doc_id) in rows
            stated.add((lk.entity, lk.relation, doc.doc_id))
    for t in triples:
        assert world.person(t.entity).split == "train"
        assert world.person(t.entity).facts[t.relation] == t.value
        if t.source is not None:
            assert (t.entity, t.relation, t.source) in stated
    facts = {(t.entity, t.relation) for t in triples}
    assert facts == {(p.name, r) for p in world.people_in("train") for r in RELATIONS}
    rows_per_fact = Counter((t.entity, t.relation) for t in triples)
    unstated = [t for t in triples if t.source is None]
    assert unstated and all(rows_per_fact[(t.entity, t.relation)] == 1 for t in unstated)
    added = world.added_triples()
    assert {(t.entity, t.relation, t.value) for t in added} == {
        (p.name, r, v) for p in world.people_in("added") for r, v in p.facts.items()}
    assert all(t.source is None for t in added)


def test_added_and_heldout_people_never_appear_in_training_text(world):
    unseen = world.people_in("added") + world.people_in("heldout")
    assert world.people_in("added") and world.people_in("heldout")
    corpus = "\n".join(d.annotated for d in world.train_documents)
    for p in unseen:
        assert p.mentions == 0 and p.name not in corpus
        assert world.mention_bucket(p.name) == "0"
    heldout_people = {d.person for d in world.heldout_documents}
    assert heldout_people & {p.name for p in world.people_in("added")}
    assert heldout_people & {p.name for p in world.people_in("train")}
    train_plain = {d.plain for d in world.train_documents}
    assert not any(d.plain in train_plain for d in world.heldout_documents)


def test_mentions_are_long_tailed_and_match_document_counts(default_world):
    w = default_world
    per_person = Counter(d.person for d in w.train_documents)
    train = w.people_in("train")
    assert all(per_person[p.name] == p.mentions for p in train)
    assert sum(per_person.values()) == len(w.train_documents)
    counts = Counter(p.mentions for p in train)
    assert counts[1] / len(train) > 0.5
    assert max(counts) > 10 and max(counts) <= w.config.max_mentions
    buckets = w.stats()["mentions"]
    assert buckets["1"] > buckets["2-4"] > buckets["5+"] > 0
    assert sum(buckets.values()) == len(train)
    assert all(w.mention_bucket(p.name) in ("1", "2-4", "5+") for p in train)


def test_documents_vary_templates_and_include_fillers(default_world):
    assert all(len(TEMPLATES[(r,)]) >= 4 for r in RELATIONS)
    openings = Counter()
    for doc in default_world.train_documents[:500]:
        sentences = re.split(r"(?<=\.) ", doc.plain)
        values = [lk.value for lk in doc.lookups]
        assert any(not any(v in s for v in values) for s in sentences)  # at least one filler sentence
        openings[sentences[0].replace(doc.person, "")[:15]] += 1
    assert len(openings) >= 10
    lookups_per_doc = Counter(len(d.lookups) for d in default_world.train_documents)
    assert min(lookups_per_doc) >= 3 and max(lookups_per_doc) == 6


def test_cloze_prompt_ends_right_before_the_value(world):
    person = world.people_in("train")[0]
    prompts = {rel: world.cloze(person.name, rel) for rel in RELATIONS}
    assert prompts["Birth Date"].prompt.endswith("was born on")
    assert prompts["Birth City"].prompt.endswith("was born in")
    assert len({c.prompt for c in prompts.values()}) == len(RELATIONS)
    for rel, c in prompts.items():
        assert c.gold == person.facts[rel] and not c.prompt.endswith(" ")
        rendering = strip(fill(COMPILED[(rel,)][0], person, named=True))
        assert rendering.startswith(c.prompt + " " + c.gold)
        assert CLOZE_TEMPLATES[rel].startswith("{Subj}")
    # the cloze templates are among those the training documents use
    plain = "\n".join(d.plain for d in world.train_documents)
    found = {c.relation for c in world.cloze_set() if f"{c.prompt} {c.gold}" in plain}
    assert found == set(RELATIONS)


def test_cloze_set_covers_pairs_and_samples_deterministically(world):
    full = world.cloze_set()
    assert len(full) == len(world.people_in("train")) * len(RELATIONS)
    sample = world.cloze_set(n=25)
    assert len(sample) == 25 and sample == world.cloze_set(n=25) and set(sample) <= set(full)
    added = world.cloze_set("added")
    assert {c.person for c in added} == {p.name for p in world.people_in("added")}
    with pytest.raises(ValueError, match="split"):
        world.cloze_set("nope")


def test_edits_change_train_facts_within_the_pool(world):
    edits = world.edits(30, seed=3)
    assert edits == world.edits(30, seed=3) and edits != world.edits(30, seed=4)
    assert len({(e.person, e.relation) for e in edits}) == 30
    for e in edits:
        p = world.person(e.person)
        assert p.split == "train" and p.facts[e.relation] == e.old_value != e.new_value
        if e.relation != "Birth Date":
            assert e.new_value in world.pools[e.relation]


def test_forget_and_retain_partition_the_train_people(world):
    forget = world.forget_set(0.1, seed=1)
    retain = world.retain_set(0.1, seed=1)
    train = {p.name for p in world.people_in("train")}
    assert len(forget) == round(0.1 * len(train))
    assert set(forget) | set(retain) == train and not set(forget) & set(retain)
    assert forget == world.forget_set(0.1, seed=1) and len(world.forget_set(0.001)) == 1


def test_save_load_round_trip(world, tmp_path):
    folder = world.save(tmp_path / "bios")
    for name in ("documents.jsonl", "people.jsonl", "triples.jsonl", "config.json"):
        assert (folder / name).exists()
    loaded = BiosWorld.load(folder)
    assert loaded == world
    assert _texts(loaded) == _texts(world) and loaded.triples() == world.triples()
    row = json.loads((folder / "documents.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert list(row)[:5] == ["id", "annotated", "text", "source", "split"] and row["source"] == "world:bios"
    assert row["person"] and row["text"] == strip(parse(row["annotated"]).segments)  # lmlm.corpus's schema
    n_rows = len((folder / "triples.jsonl").read_text(encoding="utf-8").splitlines())
    assert n_rows == len(world.triples()) + len(world.added_triples())


def test_a_world_saved_by_an_earlier_version_loads(world, tmp_path):
    folder = world.save(tmp_path / "bios")
    docs = folder / "documents.jsonl"
    rows = [json.loads(line) for line in docs.read_text(encoding="utf-8").splitlines()]
    docs.write_text("".join(json.dumps({"doc_id": r["id"], "person": r["person"], "split": r["split"],
                                        "annotated": r["annotated"], "plain": r["text"]}) + "\n" for r in rows))
    assert BiosWorld.load(folder) == world


def test_value_pools_are_shared(default_world):
    w = default_world
    n = len(w.people)
    for rel, pool_size in (("Birth City", w.config.n_cities), ("University", w.config.n_universities),
                           ("Major", w.config.n_majors), ("Employer", w.config.n_companies)):
        distinct = {p.facts[rel] for p in w.people}
        assert distinct <= set(w.pools[rel]) and len(distinct) <= pool_size < n / 5
    assert len({p.name for p in w.people}) == n
    assert any("'" in p.name for p in w.people) and any(not p.name.isascii() for p in w.people)
    years = {int(p.facts["Birth Date"][-4:]) for p in w.people}
    assert min(years) >= 1940 and max(years) <= 2000


def test_stats_and_presets(world):
    stats = world.stats()
    assert stats["people"] == {s: len(world.people_in(s)) for s in ("train", "added", "heldout")}
    assert stats["documents"] == {"train": len(world.train_documents), "heldout": world.config.n_heldout_docs}
    assert stats["triples"]["train"] == len(world.triples())
    assert stats["triples"]["added"] == len(world.added_triples())
    for name in BIOS_PRESETS:
        assert BiosConfig.from_name(name).name == name
    assert BiosConfig.from_name("smoke").n_people < BiosConfig.from_name("default").n_people
    with pytest.raises(ValueError, match="unknown bios preset"):
        BiosConfig.from_name("huge")
    with pytest.raises(ValueError, match="added_fraction"):
        BiosConfig(added_fraction=1.5)
    with pytest.raises(ValueError, match="facts_per_doc"):
        BiosConfig(facts_per_doc=(4, 2))


def test_aliases_name_one_person_each(default_world, tmp_path):
    w = default_world
    names = {p.name.casefold() for p in w.people}
    pairs = w.aliases("train") + w.aliases("added")
    assert pairs and all(a.casefold() not in names for a, _ in pairs)  # nobody's name is somebody's alias
    assert len({a.casefold() for a, _ in pairs}) == len(pairs)  # and no alias names two people
    by_person = {}
    for a, e in pairs:
        by_person.setdefault(e, []).append(a)
    double = next(p.name for p in w.people_in("train") if "-" in p.name and f"{p.name.split()[0]} "
                  f"{p.name.split(' ', 1)[1].split('-')[0]}" in by_person.get(p.name, []))
    first, last = double.split(" ", 1)
    assert f"{last}, {first}" in by_person[double]
    assert not {e for _, e in w.aliases("train")} & {p.name for p in w.people_in("heldout")}
    w.save(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "aliases.jsonl").read_text().splitlines()]
    assert [(r["alias"], r["entity"]) for r in rows] == pairs
