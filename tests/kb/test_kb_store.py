"""The SQLite store: schema by migrations, errors on foreign folders, atomic versions under SIGKILL."""

import multiprocessing as mp
import os
import signal
import sqlite3
import time

import pytest

from lmlm.kb import MIGRATIONS, KBError, KnowledgeBase, NotAKnowledgeBase, Triple
from lmlm.kb.store import SQLiteStore


def _table_counts(db) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("triples", "keys", "sources", "versions", "changes")}


def test_create_applies_every_migration(tmp_path):
    KnowledgeBase.create(tmp_path / "kb").close()
    with sqlite3.connect(tmp_path / "kb" / "kb.sqlite") as conn:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] == len(MIGRATIONS)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"triples", "sources", "versions", "changes", "keys", "meta"} <= tables
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_newer_schema_is_refused(tmp_path):
    KnowledgeBase.create(tmp_path / "kb").close()
    with sqlite3.connect(tmp_path / "kb" / "kb.sqlite") as conn:
        conn.execute("INSERT INTO schema_version(version) VALUES (?)", (len(MIGRATIONS) + 1,))
    with pytest.raises(KBError, match="newer than this lmlm"):
        KnowledgeBase.open(tmp_path / "kb")


def test_opening_what_is_not_a_kb(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        KnowledgeBase.open(tmp_path / "nowhere")
    with pytest.raises(KBError):  # every "not a KB" error is a KBError, for the CLI to report
        KnowledgeBase.open(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotAKnowledgeBase, match="has no kb.sqlite"):
        KnowledgeBase.open(tmp_path / "empty")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "kb.sqlite").write_text("hello")
    with pytest.raises(NotAKnowledgeBase, match="not a knowledge base"):
        KnowledgeBase.open(tmp_path / "junk")
    other = tmp_path / "other"
    other.mkdir()
    sqlite3.connect(other / "kb.sqlite").execute("CREATE TABLE meta (name TEXT, value TEXT)").connection.commit()
    with pytest.raises(NotAKnowledgeBase, match="not an lmlm knowledge base"):
        KnowledgeBase.open(other)


def test_create_refuses_existing(tmp_path):
    KnowledgeBase.create(tmp_path / "kb").close()
    with pytest.raises(FileExistsError, match="already holds a knowledge base"):
        KnowledgeBase.create(tmp_path / "kb")
    assert KnowledgeBase.create(tmp_path / "kb", exist_ok=True).version == 0
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        KnowledgeBase.create(tmp_path / "busy")


def test_bad_triple_in_the_middle_rolls_the_add_back(kb):
    before = _table_counts(kb.path / "kb.sqlite")
    with pytest.raises(ValueError, match="Triple.entity is empty"):
        kb.add([Triple("Grace Hopper", "Employer", "US Navy"), ("  ", "Employer", "IBM")])
    assert _table_counts(kb.path / "kb.sqlite") == before and kb.version == 1


def _add_then_hang(path: str, ready, n: int) -> None:
    """Child process: start an add, write ``n`` triples inside its transaction, then wait to be killed."""
    kb = KnowledgeBase.open(path)
    kb.store.conn.execute("PRAGMA cache_size=5")  # spill uncommitted pages into the WAL file on disk

    def triples():
        for i in range(n):
            yield Triple(f"Person {i}", "Birth City", f"City {i}", source=f"doc-{i}", position=i)
        ready.set()
        time.sleep(300)
        yield Triple("Never", "Written", "x")

    kb.add(triples(), batch_size=250)


@pytest.mark.slow
def test_sigkill_mid_add_leaves_previous_version(kb):
    db = kb.path / "kb.sqlite"
    kb.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = _table_counts(db)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_add_then_hang, args=(str(kb.path), ready, 3000))
    child.start()
    try:
        assert ready.wait(120), "child never reached the middle of its add"
        assert os.path.getsize(str(db) + "-wal") > 0  # half-written pages are on disk
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.join(30)
    assert child.exitcode == -signal.SIGKILL

    assert kb.version == 1 and len(kb) == 3  # the open instance never saw it
    reopened = KnowledgeBase.open(kb.path)
    assert reopened.version == 1 and len(reopened) == 3
    assert _table_counts(db) == before
    match = reopened.lookup("Person 7", "Birth City")
    assert match is None or match.entity != "Person 7"
    # the store is not left locked: the next change gets the next version
    assert reopened.add([Triple("Grace Hopper", "Employer", "US Navy")]) == 2
    assert kb.lookup("Grace Hopper", "Employer").value == "US Navy"
    reopened.close()


def test_store_methods_need_no_encoder(tmp_path):
    store = SQLiteStore.create(tmp_path, {"encoder": "none"})
    from lmlm.kb.store import Fact
    v = store.write_facts([Fact("A", "r", "1", 1, (("d", 0),)), Fact("a", "R", "1", 1, (("d", 0),))], "add", "t", "")
    assert v == 1 and store.counts()["triples"] == 1  # second is the same fact from the same place
    assert store.get(1).count == 1
    store.close()


def test_a_write_that_forgets_its_cached_ids_stores_the_same_kb(tmp_path):
    from lmlm.kb.store import Fact

    # names, keys and facts seen again chunks apart, after the write's cache of ids was emptied
    facts = [Fact(f"Person {i % 7}", f"rel {i % 3}", f"v{i % 2}", 1, ((f"doc{i % 4}", i % 5),)) for i in range(120)]
    dump = []
    for name, limit in (("big", 1_000_000), ("small", 2)):
        (tmp_path / name).mkdir()
        store = SQLiteStore.create(tmp_path / name, {"encoder": "none"})
        store.write_facts(facts, "add", "t", "", batch_size=4, cache_limit=limit)
        dump.append([store.conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
                     for t in ("entities", "relations", "keys", "documents", "triples", "sources", "changes")])
        store.close()
    assert dump[0] == dump[1]
    assert len(dump[0][4]) == 42 and sum(row[4] for row in dump[0][4]) == 120  # 42 facts, each counted when seen


def _add_same_facts(path: str, name: str, rounds: int) -> None:
    kb = KnowledgeBase.open(path)
    for i in range(rounds):
        kb.add([Triple(f"Person {j}", "Employer", f"Org {j}", source=f"{name}-{i}") for j in range(20)],
               who=name, embed=False)
    kb.close()


def test_writers_adding_the_same_facts_at_once_keep_one_row_per_fact(tmp_path):
    # no unique index holds this: the writer checks for the active row inside its write transaction
    KnowledgeBase.create(tmp_path / "kb").close()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_add_same_facts, args=(str(tmp_path / "kb"), f"w{n}", 5)) for n in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with sqlite3.connect(tmp_path / "kb" / "kb.sqlite") as c:
        assert c.execute("SELECT count(*), sum(count) FROM triples WHERE deleted_version IS NULL").fetchone() == (20, 300)
        assert c.execute("SELECT count(*) FROM sources").fetchone()[0] == 300
