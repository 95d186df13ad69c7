"""Deletes that take effect: by relation, by source, by a forget set; several values per key."""

import pytest

from lmlm.kb import AnnConfig, KBError, KnowledgeBase, Triple

PEOPLE = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Marie Curie", "Emmy Noether", "Niels Bohr",
          "Lise Meitner", "Paul Dirac", "Rosalind Franklin", "Kurt Godel", "Claude Shannon", "Enrico Fermi"]
RELATIONS = {"Birth City": "City", "Employer": "Org", "Spouse": "Name", "Alma Mater": "Uni", "Award": "Prize"}


def _people_kb(path, encoder, ann=None):
    kb = KnowledgeBase.create(path, encoder=encoder, ann=ann)
    kb.add([Triple(p, r, f"{v} {i}", source=f"bio-{i}", position=10 * j)
            for i, p in enumerate(PEOPLE) for j, (r, v) in enumerate(RELATIONS.items())], who="t", why="seed")
    return kb


def test_delete_by_source_and_by_relation(kb):
    kb.add([Triple("Alan Turing", "Birth City", "London", source="bio-ada")])  # bio-ada now cites two facts
    assert kb.delete(source="bio-ada", who="t") == 2
    for person in ("Ada Lovelace", "Alan Turing"):
        m = kb.lookup(person, "Birth City")
        assert m is None or m.relation != "Birth City"  # a fuzzy hit on another key is fine, the fact is gone
    assert kb.delete(relation="OCCUPATION", who="t") == 1
    assert all(m.relation != "Occupation" for m in kb.search("Alan Turing", "Occupation", k=5))
    assert kb.lookup("Charles Babbage", "Death Year").value == "1871" and len(kb) == 1


def test_forget_set_of_every_kind_is_one_version(kb):
    kb.add([Triple("Grace Hopper", "Employer", "US Navy", source="bio-grace"),
            Triple("Grace Hopper", "Birth Year", "1906", source="bio-grace"),
            Triple("Grace Hopper", "Spouse", "Vincent Hopper"),
            Triple("Marie Curie", "Spouse", "Pierre Curie")])
    n = kb.forget([1, ("Charles Babbage", "Death Year"), ("Alan Turing", "occupation", "MATHEMATICIAN"),
                   Triple("Marie Curie", "Spouse", "Pierre Curie"), {"source": "bio-grace"},
                   {"entity": "Grace Hopper", "relation": "Spouse"}, ("Nobody", "Nothing")], who="dpo", why="erasure")
    assert n == 7 and len(kb) == 0
    assert kb.log(1)[0].op == "delete" and kb.log(1)[0].n_changed == 7 and kb.version == 3
    assert kb.forget([("Ada Lovelace", "Birth City")]) == 0 and kb.version == 3  # nothing left: no version
    with pytest.raises(ValueError, match="forget item 1 is not a triple id"):
        kb.forget([2, "Ada Lovelace"])
    with pytest.raises(ValueError, match="forget item 0: empty entity"):
        kb.forget([("", "Birth City")])


def test_forgotten_facts_are_unreachable_through_the_ann_index_in_every_handle(tmp_path, encoder):
    ann = AnnConfig(flat_max=20, ivf_min=10_000)  # 60 keys: an HNSW index
    kb = _people_kb(tmp_path / "kb", encoder, ann)
    assert kb.stats()["index_kind"] == "hnsw" and kb.stats()["index_size"] == 60
    other = KnowledgeBase.open(kb.path, ann=ann)
    assert other.lookup("Ada Lovelace", "place of birth", matching="key").value == "City 0"  # index loaded, warm
    n = kb.forget([{"entity": "Ada Lovelace", "relation": r} for r in RELATIONS] + [{"source": "bio-3"}], who="t")
    assert n == 10
    for handle in (kb, other, KnowledgeBase.open(kb.path, ann=ann)):
        for person in ("Ada Lovelace", "Marie Curie"):
            for r in RELATIONS:
                for query in (r, r.lower() + " of"):  # exact, then fuzzy
                    m = handle.lookup(person, query, threshold=0.0, matching="key")
                    assert m is not None and m.entity != person
                    assert handle.lookup(person, query, threshold=0.0) is None  # entity-aware: no one else
            assert all(h.entity != person for h in handle.search(person, "Birth City", k=50))
        assert handle.lookup("Alan Turing", "place of birth").value == "City 1"
        assert len(handle) == 50
    assert kb.stats()["index_size"] == 50
    other.close()
    kb.close()


def test_several_values_per_key_best_supported_first(kb):
    kb.add([Triple("Ada Lovelace", "Birth City", "Paris", source=f"rumour-{i}") for i in range(3)])
    m = kb.lookup("Ada Lovelace", "Birth City")
    assert (m.value, m.support, m.alternatives) == ("Paris", 3, 1)
    assert [(r.value, r.count) for r in kb.values("ada lovelace", "BIRTH CITY")] == [("Paris", 3), ("London", 1)]
    kb.delete(triple_ids=m.triple_id)
    m = kb.lookup("Ada Lovelace", "Birth City")
    assert (m.value, m.support, m.alternatives) == ("London", 1, 0)


def test_edit_keeps_the_old_value_in_history_and_out_of_lookups(kb):
    kb.add([Triple("Ada Lovelace", "Birth City", "Paris")])
    kb.edit("Ada Lovelace", "Birth City", "Marylebone", who="editor", why="more precise")
    assert [r.value for r in kb.values("Ada Lovelace", "Birth City")] == ["Marylebone"]
    assert {r.value: r.active for r in kb.history("Ada Lovelace", "Birth City")} == \
        {"London": False, "Paris": False, "Marylebone": True}
    with pytest.raises(KBError, match="no active fact"):
        kb.edit("Ada Lovelace", "Death Year", "1852")


def test_exact_only_lookups(kb):
    assert kb.lookup("ada lovelace", "BIRTH CITY", fuzzy=False).value == "London"
    assert kb.lookup("Ada Lovelace", "birthplace", fuzzy=False) is None
    assert kb.lookup("Ada Lovelace", "birthplace").value == "London"
    assert [m and m.value for m in kb.lookup_batch([("Alan Turing", "Occupation"), ("Alan Turing", "job")],
                                                   fuzzy=False)] == ["mathematician", None]


def test_a_forget_set_resolved_from_the_map_matches_the_store(tmp_path, encoder):
    kb = _people_kb(tmp_path / "kb", encoder)
    kb.add([Triple("Ada Lovelace", "Birth City", "Paris")])  # a key with two values: left to the store
    items = [(p, "Employer", "ORG  %d" % i) for i, p in enumerate(PEOPLE[:6])]  # values as another spelling
    items += [("Alan Turing", "Spouse", "not his spouse"), ("Ada Lovelace", "Birth City", "Paris"),
              ("Marie Curie", "Award"), ("Nobody", "Employer", "Org 0")]
    assert kb.forget(items, who="t") == 8
    fresh = KnowledgeBase.open(kb.path, encoder=encoder)  # reads everything from the store
    assert len(kb) == len(fresh) == 53 and kb.key_ids() == fresh.key_ids()
    assert kb.lookup("Ada Lovelace", "Birth City").value == "City 0"
    assert kb.lookup("Alan Turing", "Spouse").value == "Name 1"
    for handle in (kb, fresh):
        assert handle.lookup("Grace Hopper", "Employer", fuzzy=False) is None
        assert handle.lookup("Marie Curie", "Award", fuzzy=False) is None
    fresh.close()
    kb.close()


def test_a_forget_set_resolved_at_an_older_version_is_looked_up_again(tmp_path, encoder):
    kb = _people_kb(tmp_path / "kb", encoder)
    known, _ = kb._known_ids(["ada lovelace\tbirth city"], [])  # one value now: resolved to its id
    assert len(known[1]) == 1
    other = KnowledgeBase.open(kb.path, encoder=encoder)
    other.add([Triple("Ada Lovelace", "Birth City", "Paris")], who="other")  # another process writes
    version, n = kb.store.forget("t", "", keys=["ada lovelace\tbirth city"], known=known)
    assert n == 2  # both values: the stale resolution was not used
    other.close()
    kb.close()


def test_a_handle_that_has_read_nothing_forgets_and_adds_through_the_store(tmp_path, encoder):
    kb = _people_kb(tmp_path / "kb", encoder)
    kb.add([Triple("Ada Lovelace", "Birth City", "Paris")])
    items = [(p, "Employer", "ORG  %d" % i) for i, p in enumerate(PEOPLE[:6])]
    items += [("Alan Turing", "Spouse", "not his spouse"), ("Ada Lovelace", "Birth City", "Paris"),
              ("Marie Curie", "Award"), ("Nobody", "Employer", "Org 0")]
    cold = KnowledgeBase.open(kb.path, encoder=encoder)  # no lookup yet: its map of the store is unread
    assert cold.forget(items, who="t") == 8  # what the map-resolved forget above deletes
    writer = KnowledgeBase.open(kb.path, encoder=encoder)
    writer.add([Triple("Alan Turing", "Spouse", "Nobody")], who="t", embed=False)  # writes without reading
    for handle in (kb, cold, writer):
        assert len(handle) == 54
        assert handle.lookup("Grace Hopper", "Employer", fuzzy=False) is None
        assert handle.lookup("Ada Lovelace", "Birth City", fuzzy=False).value == "City 0"
        assert handle.lookup("Alan Turing", "Spouse", fuzzy=False).alternatives == 1
    assert cold.key_ids() == kb.key_ids() == writer.key_ids()
    for handle in (kb, cold, writer):
        handle.close()
