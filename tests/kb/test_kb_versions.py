"""Versions: diff between two, checkout of a past one, and the migration that made both possible."""

import sqlite3

import pytest

from lmlm.kb import MIGRATIONS, KBError, KnowledgeBase, Triple
from wide_layout import WIDE_LAYOUT, check_wide_layout_migrated


@pytest.fixture
def story(kb):
    """kb (v1: three facts) -> v2 add Grace and support Ada -> v3 edit Babbage -> v4 delete Turing."""
    kb.add([Triple("Grace Hopper", "Employer", "US Navy", source="bio-grace"),
            Triple("Ada Lovelace", "Birth City", "London", source="bio-ada-2")], who="alice", why="more bios")
    kb.edit("Charles Babbage", "Death Year", "1872", who="bob", why="typo")
    kb.delete(entity="Alan Turing", who="carol", why="request")
    return kb


def _ops(entries):
    return sorted((e.op, e.entity, e.value, e.count_before, e.count_after) for e in entries)


def test_diff_names_added_removed_and_supported(story):
    assert _ops(story.diff(1, 4)) == [
        ("added", "Charles Babbage", "1872", 0, 1), ("added", "Grace Hopper", "US Navy", 0, 1),
        ("removed", "Alan Turing", "mathematician", 1, 0), ("removed", "Charles Babbage", "1871", 1, 0),
        ("support", "Ada Lovelace", "London", 1, 2)]
    assert _ops(story.diff(4, 1)) == [
        ("added", "Alan Turing", "mathematician", 0, 1), ("added", "Charles Babbage", "1871", 0, 1),
        ("removed", "Charles Babbage", "1872", 1, 0), ("removed", "Grace Hopper", "US Navy", 1, 0),
        ("support", "Ada Lovelace", "London", 2, 1)]
    assert _ops(story.diff(3, 4)) == [("removed", "Alan Turing", "mathematician", 1, 0)]
    assert story.diff(2, 2) == [] and len(story.diff(0, 1)) == 3
    with pytest.raises(KBError, match="no version 9 .* versions run from 0 to 4"):
        story.diff(1, 9)


def test_checkout_reads_values_counts_and_sources_of_the_past(story):
    old = story.checkout(1)
    m = old.lookup("Charles Babbage", "Death Year")
    assert (m.value, m.version, m.support) == ("1871", 1, 1)
    assert old.lookup("Ada Lovelace", "Birth City").sources == ("bio-ada",)  # bio-ada-2 came in v2
    assert story.lookup("Ada Lovelace", "Birth City").sources == ("bio-ada", "bio-ada-2")
    assert old.lookup("Alan Turing", "job", matching="key").value == "mathematician"  # fuzzy, on a key deleted since
    assert old.lookup("Alan Turing", "job").value == "mathematician"  # the entity of the past version
    assert story.lookup("Alan Turing", "job", threshold=0.0, matching="key").entity != "Alan Turing"
    assert story.lookup("Alan Turing", "job", threshold=0.0) is None  # entity-aware: deleted, no namesake
    grace = old.lookup("Grace Hopper", "Employer")  # added in v2
    assert grace is None or grace.entity != "Grace Hopper"
    assert len(old) == 3 and old.stats()["triples"] == 3 and old.stats()["read_only"]
    assert [(r.value, r.count) for r in old.values("Ada Lovelace", "Birth City")] == [("London", 1)]
    assert [(r.entity, r.value, r.count, r.sources) for r in old.triples()] == [
        ("Ada Lovelace", "London", 1, (("bio-ada", 10),)), ("Charles Babbage", "1871", 1, (("bio-babbage", 42),)),
        ("Alan Turing", "mathematician", 1, (("bio-turing", 0),))]
    assert [v.version for v in old.log()] == [1]
    v3 = story.checkout(3)
    assert v3.lookup("Charles Babbage", "Death Year").value == "1872" and v3.lookup("Alan Turing", "Occupation").exact
    assert story.checkout(0).lookup("Ada Lovelace", "Birth City") is None


def test_checkout_is_read_only_and_leaves_the_kb_open(story, tmp_path):
    old = story.checkout(2)
    for write in (lambda: old.add([Triple("a", "b", "c")]), lambda: old.delete(entity="Ada Lovelace"),
                  lambda: old.edit("Ada Lovelace", "Birth City", "Paris"), lambda: old.forget([1]),
                  lambda: old.import_jsonl(tmp_path / "x.jsonl")):
        with pytest.raises(KBError, match="at version 2 is read-only"):
            write()
    assert old.export(tmp_path / "v2.jsonl") == 4
    old.close()
    assert story.version == 4 and story.lookup("Grace Hopper", "Employer").value == "US Navy"
    with pytest.raises(KBError, match="no version -1"):
        story.checkout(-1)


def test_a_kb_of_the_first_schema_is_migrated_and_readable_in_the_past(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    with sqlite3.connect(folder / "kb.sqlite") as c:  # what the first schema's code wrote
        c.executescript(MIGRATIONS[0])
        c.executescript("""
            CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (1);
            INSERT INTO meta VALUES ('format', 'lmlm-kb'), ('encoder', 'all-MiniLM-L6-v2');
            INSERT INTO versions VALUES (1, 't', 'a', '', 'add', 1), (2, 't', 'a', '', 'add', 1);
            INSERT INTO keys VALUES (1, 'ada lovelace' || char(9) || 'birth city', 'Ada Lovelace', 'Birth City');
            INSERT INTO triples VALUES (1, 1, 'Ada Lovelace', 'Birth City', 'London',
                'ada lovelace' || char(9) || 'birth city', 'ada lovelace', 'birth city', 'london', 2, 1, NULL);
            INSERT INTO sources VALUES (1, 'bio-ada', 10), (1, 'bio-ada-2', NULL);
            INSERT INTO changes VALUES (1, 1, 'add', NULL, 'London'), (2, 1, 'support', 'London', 'London');
        """)
    kb = KnowledgeBase.open(folder)
    with sqlite3.connect(folder / "kb.sqlite") as c:
        assert c.execute("SELECT max(version) FROM schema_version").fetchone()[0] == len(MIGRATIONS) == 5
        # sources are their own unique index: a table without rowids, no second b-tree
        assert "WITHOUT ROWID" in c.execute("SELECT sql FROM sqlite_master WHERE name = 'sources'").fetchone()[0]
        assert {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'sources' AND type = 'index'"
                                        " AND sql IS NOT NULL")} == {"sources_doc"}
    m = kb.lookup("Ada Lovelace", "Birth City")
    assert (m.value, m.support, m.sources) == ("London", 2, ("bio-ada", "bio-ada-2"))
    assert kb.get(m.triple_id).sources == (("bio-ada", 10), ("bio-ada-2", None))  # no position stays none
    assert kb.checkout(1).lookup("Ada Lovelace", "Birth City").value == "London"
    assert kb.add([Triple("Ada Lovelace", "Birth City", "London", source="bio-ada-3")]) == 3
    assert _ops(kb.diff(2, 3)) == [("support", "Ada Lovelace", "London", 2, 3)]
    kb.close()


def test_a_kb_of_the_wide_layout_is_migrated_to_the_compact_one(tmp_path):
    folder = tmp_path / "wide"
    folder.mkdir()
    with sqlite3.connect(folder / "kb.sqlite") as c:
        c.executescript(";".join(MIGRATIONS[:3]) + ";" + WIDE_LAYOUT)
    kb = KnowledgeBase.open(folder)
    with sqlite3.connect(folder / "kb.sqlite") as c:
        assert {r[1] for r in c.execute("PRAGMA table_info(triples)")} == {
            "id", "key_id", "value", "value_norm", "count", "created_version", "deleted_version"}
        assert c.execute("SELECT doc_id FROM documents ORDER BY id").fetchall() == [
            ("bio-ada",), ("bio-ada-2",), ("bio-turing",), ("bio-ada-3",)]
        assert c.execute("PRAGMA foreign_key_check").fetchall() == []
    check_wide_layout_migrated(kb)
    kb.close()


def test_checkout_finds_deleted_keys_after_the_index_dropped_them(story):
    index = story.key_index()
    index.rebuild()  # drops the vectors of keys no longer live (Alan Turing's, Babbage's old value kept its key)
    assert story.checkout(1).lookup("Alan Turing", "job", matching="key").value == "mathematician"  # embedded again
    assert story.lookup("Alan Turing", "job", threshold=0.0, matching="key").entity != "Alan Turing"
    assert story.lookup("Alan Turing", "job", threshold=0.0) is None  # entity-aware: deleted, no namesake
