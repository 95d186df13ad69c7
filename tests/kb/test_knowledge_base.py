"""KnowledgeBase end to end: real MiniLM, real FAISS, real SQLite in a temporary folder."""

import dataclasses
import json

import pytest

from lmlm.kb import KBError, KnowledgeBase, Match, Triple
from lmlm.lookup import parse


def test_exact_hit_ignores_spelling(kb):
    m = kb.lookup("  ada_lovelace ", "BIRTH CITY:")
    assert m == Match(entity="Ada Lovelace", relation="Birth City", value="London", score=1.0, triple_id=1,
                      exact=True, sources=("bio-ada",), version=1, alternatives=0, via="exact", entity_score=1.0)


def test_fuzzy_hit_on_paraphrase(kb):
    m = kb.lookup("Ada Lovelace", "birthplace")
    assert m is not None and not m.exact
    assert (m.entity, m.relation, m.value) == ("Ada Lovelace", "Birth City", "London")
    assert 0.6 <= m.score < 1.0


def test_miss_below_threshold_is_none(kb):
    assert kb.lookup("Marie Curie", "Spouse") is None
    assert kb.lookup("Ada Lovelace", "birthplace", threshold=0.95) is None
    kb.relation_threshold = 0.95  # entity-aware matching: the relation must be this similar
    assert kb.lookup("Ada Lovelace", "birthplace") is None
    kb.threshold = 0.95  # the paper's single-key match: the whole key must be
    assert kb.lookup("Ada Lovelace", "birthplace", matching="key") is None
    assert kb.lookup("", "  ") is None


def test_search_lists_candidates_with_scores(kb):
    hits = kb.search("Ada Lovelace", "Birth City", k=3)
    assert [h.entity for h in hits][0] == "Ada Lovelace" and hits[0].exact and hits[0].score == 1.0
    assert len(hits) == 3 and hits[1].score >= hits[2].score and not hits[1].exact


@pytest.mark.parametrize("matching", ["key", "entity"])
def test_batch_equals_single_with_one_encoder_call(kb, encoder, monkeypatch, matching):
    queries = [("Ada Lovelace", "Birth City"), ("Alan Turing", "job"), ("Marie Curie", "Spouse"),
               ("Babbage", "year of death"), ("ada lovelace", "birth city")]
    contexts = [None, None, None, "Charles Babbage was a mathematician.", None]  # "Babbage" alone names no one
    single = [kb.lookup(*q, context=c, matching=matching) for q, c in zip(queries, contexts)]
    encoder.clear_cache()
    calls = []
    real_encode = encoder.encode
    monkeypatch.setattr(encoder, "encode", lambda texts, **kw: calls.append(list(texts)) or real_encode(texts, **kw))
    batch = kb.lookup_batch(queries, contexts=contexts, matching=matching)
    # the two exact queries never reach the encoder; entity-aware matching embeds only the relations
    # it does not hold (Marie Curie is no entity of this KB, so hers is never asked)
    assert calls == ([["Alan Turing job", "Marie Curie Spouse", "Babbage year of death"]] if matching == "key"
                     else [["job", "year of death"]])
    assert [m is None for m in batch] == [m is None for m in single] == [False, False, True, False, False]
    for b, s in zip(batch, single):
        if b is not None:
            assert dataclasses.replace(b, score=0.0) == dataclasses.replace(s, score=0.0)
            assert b.score == pytest.approx(s.score, abs=1e-4)


@pytest.mark.parametrize("how", ["triple_ids", "entity", "source"])
def test_delete_is_immediate_everywhere(kb, how):
    other = KnowledgeBase.open(kb.path)  # a second handle, as another process would hold
    assert other.lookup("Ada Lovelace", "birthplace").value == "London"  # its index is warm
    by = {"triple_ids": {"triple_ids": [1]}, "entity": {"entity": "ADA LOVELACE"}, "source": {"source": "bio-ada"}}
    assert kb.delete(**by[how], who="tester", why="forget Ada") == 1
    for handle in (kb, other, KnowledgeBase.open(kb.path)):
        assert handle.lookup("Ada Lovelace", "Birth City") is None  # exact
        assert handle.lookup("Ada Lovelace", "birthplace") is None  # fuzzy
        assert all(m.triple_id != 1 for m in handle.search("Ada Lovelace", "Birth City", k=5))
        assert handle.lookup("Alan Turing", "Occupation").value == "mathematician"
        assert len(handle) == 2
    # and the other way round: a delete through the second handle reaches the first
    assert other.delete(entity="Charles Babbage", who="other") == 1
    assert kb.lookup("Charles Babbage", "Death Year") is None and kb.lookup("Babbage", "died") is None
    assert kb.log(1)[0].who == "other" and kb.version == 3
    other.close()


def test_delete_needs_a_filter_and_counts_nothing_deleted(kb):
    with pytest.raises(ValueError, match="at least one of"):
        kb.delete()
    assert kb.delete(entity="Nobody") == 0 and kb.version == 1


def test_other_handle_sees_adds(kb):
    other = KnowledgeBase.open(kb.path)
    other.lookup("Ada Lovelace", "birthplace")  # build its index at version 1
    kb.add([Triple("Grace Hopper", "Employer", "US Navy", source="bio-grace")])
    assert other.lookup("Grace Hopper", "Employer").exact
    m = other.lookup("Grace Hopper", "employed by")
    assert m is not None and m.value == "US Navy" and m.version == 2
    other.close()


def test_edit_keeps_history(kb):
    v = kb.edit("Charles Babbage", "Death Year", "1872", who="editor", why="typo")
    assert v == 2 and kb.lookup("Charles Babbage", "Death Year").value == "1872"
    assert kb.lookup("Babbage", "year of death", context="Charles Babbage was born in London.").value == "1872"
    assert kb.lookup("Babbage", "died", matching="key").value == "1872"
    old, new = kb.history("charles babbage", "death year")
    assert (old.value, old.deleted_version, old.active) == ("1871", 2, False)
    assert (new.value, new.created_version, new.active) == ("1872", 2, True)
    assert kb.get(old.id).sources == (("bio-babbage", 42),)
    entry = kb.log(1)[0]
    assert (entry.version, entry.op, entry.who, entry.why) == (2, "edit", "editor", "typo")
    changes = {(c.op, c.old_value, c.new_value) for c in kb.changes(2)}
    assert changes == {("edit", "1871", "1872"), ("add", None, "1872")}
    assert kb.edit("Charles Babbage", "Death Year", "1872") == 2  # already so: no new version
    with pytest.raises(KBError, match="no active fact"):
        kb.edit("Nobody", "Death Year", "1900")


def test_several_values_best_supported_wins(kb):
    kb.add([Triple("Ada Lovelace", "Birth City", "Paris", source=f"rumour-{i}") for i in range(2)])
    m = kb.lookup("Ada Lovelace", "Birth City")
    assert (m.value, m.alternatives, m.sources) == ("Paris", 1, ("rumour-0", "rumour-1"))
    kb.add([Triple("ada lovelace", "birth city", "london", source="bio-ada-2")])  # same fact, new source
    m = kb.lookup("Ada Lovelace", "Birth City")
    assert (m.value, m.alternatives) == ("Paris", 1)  # 2 against 2: the newer fact wins the tie
    kb.add([Triple("Ada Lovelace", "Birth City", "London", source="bio-ada-3")])
    m = kb.lookup("Ada Lovelace", "Birth City")
    assert (m.value, m.alternatives, m.sources) == ("London", 1, ("bio-ada", "bio-ada-2", "bio-ada-3"))
    assert kb.get(m.triple_id).count == 3 and len(kb) == 4
    assert kb.lookup("Ada Lovelace", "birthplace").value == "London"


def test_readding_from_same_source_changes_nothing(kb, facts):
    assert kb.add(facts) == 1 and kb.get(1).count == 1
    assert kb.add([Triple("Ada Lovelace", "Birth City", "London")]) == 2  # no source: counts as seen again
    assert kb.get(1).count == 2 and len(kb) == 3


def test_versions_increment_and_log(kb):
    assert kb.version == 1
    assert kb.add([Triple("Grace Hopper", "Employer", "US Navy")], who="alice", why="new bio") == 2
    assert kb.add([Triple("Grace Hopper", "Employer", "US Navy", source="bio-grace")], who="bob") == 3
    assert kb.delete(entity="Grace Hopper", who="carol", why="gdpr") == 1
    log = kb.log()
    assert [(r.version, r.op, r.who, r.why, r.n_changed) for r in log] == [
        (4, "delete", "carol", "gdpr", 1), (3, "add", "bob", "", 1), (2, "add", "alice", "new bio", 1),
        (1, "add", "tester", "fixture", 3)]
    assert kb.stats()["versions"] == 4 and kb.log(limit=2)[0].version == 4


def test_reopen_persists_and_rebuilds_a_lost_index(kb):
    kb.close()
    reopened = KnowledgeBase.open(kb.path)
    assert reopened.version == 1 and len(reopened) == 3
    assert reopened.lookup("Alan Turing", "job", matching="key").value == "mathematician"
    assert reopened.stats()["index_version"] == 1 and reopened.stats()["index_size"] == 3
    reopened.close()
    (kb.path / "index.faiss").unlink()
    rebuilt = KnowledgeBase.open(kb.path / "kb.sqlite")
    assert rebuilt.lookup("Alan Turing", "job", matching="key").value == "mathematician"
    assert rebuilt.stats()["index_size"] == 3
    rebuilt.close()


def test_export_import_roundtrip(kb, tmp_path):
    kb.add([Triple("Ada Lovelace", "Birth City", "London", source="bio-ada-2")])
    assert kb.export_jsonl(tmp_path / "kb.jsonl") == 3
    first = json.loads((tmp_path / "kb.jsonl").read_text().splitlines()[0])
    assert first["count"] == 2 and first["sources"] == [["bio-ada", 10], ["bio-ada-2", None]]
    copy = KnowledgeBase.create(tmp_path / "copy")
    assert copy.import_jsonl(tmp_path / "kb.jsonl", who="importer") == 1
    assert [(t.entity, t.value, t.count, t.sources) for t in copy.triples()] == \
           [(t.entity, t.value, t.count, t.sources) for t in kb.triples()]
    assert copy.log()[0].op == "import" and copy.lookup("Ada Lovelace", "birthplace").value == "London"
    assert copy.import_jsonl(tmp_path / "kb.jsonl") == 1  # same facts from the same sources: no change
    (tmp_path / "bad.jsonl").write_text('{"entity": "A", "relation": "r", "value": "v"}\n{"entity": "A"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        copy.import_jsonl(tmp_path / "bad.jsonl")
    assert copy.version == 1


def test_add_accepts_lookups_and_tuples(kb):
    doc = parse("Grace [dblookup('Grace Hopper', 'Employer') -> US Navy] US Navy")
    kb.add(doc.lookups)
    kb.add([("Grace Hopper", "Birth Year", "1906", "bio-grace", 3)])
    assert kb.lookup("Grace Hopper", "Employer").value == "US Navy"
    assert kb.lookup("Grace Hopper", "Birth Year").sources == ("bio-grace",)


def test_errors_name_the_problem(kb):
    with pytest.raises(ValueError, match="Triple.entity is empty"):
        Triple("", "Birth City", "London")
    with pytest.raises(ValueError, match="Triple.value is blank"):
        Triple("Ada", "Birth City", "  ")
    with pytest.raises(TypeError, match="Triple.relation must be str"):
        Triple("Ada", None, "London")
    with pytest.raises(KeyError, match="no triple with id 99"):
        kb.get(99)
    with pytest.raises(ValueError, match="who must be"):
        kb.add([Triple("Ada", "r", "v")], who="")


def test_a_handle_that_writes_and_reports_never_reads_the_map(tmp_path):
    kb = KnowledgeBase.create(tmp_path / "kb")
    kb.add([("Ada Lovelace", "Birth City", "London"), ("Ada Lovelace", "Birth City", "Paris"),
            ("Alan Turing", "Birth City", "London")], embed=False)
    kb.forget([("Ada Lovelace", "Birth City", "Paris")])
    assert (kb.version, len(kb), kb.stats()["triples"], kb.stats()["keys"]) == (2, 2, 2, 2)
    assert not kb._loaded  # an import at 10^7 keys never holds the map of the store in memory
    assert kb.lookup("ada lovelace", "birth city", fuzzy=False).value == "London"
    assert kb._loaded and len(kb) == 2
    kb.close()
